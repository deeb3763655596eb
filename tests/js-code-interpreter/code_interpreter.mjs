// What a user of the unmodified `@e2b/code-interpreter` JavaScript SDK
// (pinned in package-lock.json) notices against warren: state kept across
// `runCode` calls, output streamed to `onStdout` while the code runs,
// exceptions as `execution.error`, matplotlib figures as PNG, isolated
// contexts, a `timeoutMs` that stops the code but keeps the context, and
// JavaScript and bash contexts.
//
// Run by crates/warren/tests/code_interpreter.rs, one case per invocation:
//
//     node code_interpreter.mjs CASE
//
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Each case asserts
// what the user sees and prints one JSON line of facts (`RESULT {...}`); it
// exits non-zero on a failed assertion.

import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

function result(facts) {
  console.log('RESULT ' + JSON.stringify(facts))
}

async function withSandbox(body, opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts })
  try {
    await body(sbx)
  } finally {
    await sbx.kill()
  }
}

// A sandbox's opt-out of the access token on the context routes, which
// the pinned SDK's context calls need: it sends no token there.
const OPEN_CONTEXTS = { envs: { CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN: '1' } }

const cases = {
  // Variables live on between runCode calls.
  async state() {
    await withSandbox(async (sbx) => {
      const first = await sbx.runCode('x = 41')
      assert.equal(first.error, undefined)
      const second = await sbx.runCode('x += 1\nx')
      assert.equal(second.text, '42')
      assert.ok(second.executionCount > first.executionCount)
      result({ text: second.text, counts: [first.executionCount, second.executionCount] })
    })
  },

  // `print` reaches onStdout while the code still runs: the code waits for
  // a file only the onStdout callback writes.
  async streaming() {
    await withSandbox(async (sbx) => {
      const seen = []
      const code = [
        'import os, time',
        "print('waiting for the client', flush=True)",
        'deadline = time.monotonic() + 120',
        "while not os.path.exists('/tmp/go') and time.monotonic() < deadline:",
        '    time.sleep(0.05)',
        "print('released' if os.path.exists('/tmp/go') else 'never released')",
      ].join('\n')
      const execution = await sbx.runCode(code, {
        timeoutMs: 180_000,
        onStdout: async (msg) => {
          seen.push(msg.line)
          if (msg.line.startsWith('waiting')) await sbx.files.write('/tmp/go', 'go')
        },
      })
      const out = execution.logs.stdout.join('')
      assert.ok(out.includes('released') && !out.includes('never released'), out)
      assert.ok(seen[0].startsWith('waiting'), JSON.stringify(seen))
      result({ stdout: execution.logs.stdout })
    })
  },

  // An exception is execution.error with its name; the context goes on.
  async error() {
    await withSandbox(async (sbx) => {
      const execution = await sbx.runCode("raise KeyError('missing')")
      assert.ok(execution.error, 'an error')
      assert.equal(execution.error.name, 'KeyError')
      assert.ok(execution.error.traceback.includes('KeyError'))
      const again = await sbx.runCode('2 * 3')
      assert.equal(again.text, '6')
      result({ name: execution.error.name, value: execution.error.value })
    })
  },

  // A matplotlib figure comes back as a PNG result.
  async matplotlib() {
    await withSandbox(async (sbx) => {
      const execution = await sbx.runCode(
        'import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [3, 5])\nplt.show()'
      )
      assert.equal(execution.error, undefined)
      const pngs = execution.results.filter((r) => r.png)
      assert.equal(pngs.length, 1)
      const bytes = Buffer.from(pngs[0].png, 'base64')
      assert.deepEqual([...bytes.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47])
      result({ pngBytes: bytes.length, formats: pngs[0].formats() })
    })
  },

  // Two contexts do not share variables. The SDK sends no access token on
  // its context calls: refused (401) by default, taken by a sandbox made
  // with CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN=1.
  async contexts() {
    let refused
    await withSandbox(async (sbx) => {
      try {
        await sbx.createCodeContext()
        assert.fail('a context call without the token was taken')
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e
        refused = String(e)
      }
      assert.ok(refused.includes('401'), refused)
    })
    await withSandbox(async (sbx) => {
      const a = await sbx.createCodeContext()
      const b = await sbx.createCodeContext({ cwd: '/tmp' })
      await sbx.runCode("where = 'a'", { context: a })
      const inB = await sbx.runCode('where', { context: b })
      assert.equal(inB.error?.name, 'NameError')
      const inA = await sbx.runCode('where', { context: a })
      assert.equal(inA.text, "'a'")
      const listed = (await sbx.listCodeContexts()).map((c) => c.id)
      assert.ok(listed.includes(a.id) && listed.includes(b.id))
      await sbx.removeCodeContext(b)
      assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(b.id))
      result({ contexts: listed.length, refused })
    }, OPEN_CONTEXTS)
  },

  // A loop stopped by a short timeoutMs: the kernel was interrupted and the
  // context keeps its state.
  async timeout() {
    await withSandbox(async (sbx) => {
      await sbx.runCode('n = 0')
      let message
      try {
        await sbx.runCode('import time\nwhile True:\n    n += 1\n    time.sleep(0.001)', {
          timeoutMs: 3_000,
        })
        assert.fail('an endless loop finished')
      } catch (e) {
        if (e instanceof assert.AssertionError) throw e
        message = String(e)
      }
      assert.ok(message.includes('timed out'), message)
      const first = await sbx.runCode('n', { timeoutMs: 120_000 })
      const second = await sbx.runCode('n', { timeoutMs: 120_000 })
      assert.ok(Number(first.text) > 0, first.text)
      assert.equal(first.text, second.text, 'the loop still runs')
      result({ timeout: message, n: Number(first.text) })
    })
  },

  // JavaScript and bash run in their own contexts.
  async languages() {
    await withSandbox(async (sbx) => {
      const js = await sbx.runCode('const seven = 7;\nconsole.log("js here");\nseven * 6', {
        language: 'js',
      })
      assert.equal(js.error, undefined)
      assert.deepEqual(js.logs.stdout, ['js here\n'])
      assert.equal(js.text, '42')
      const ctx = await sbx.createCodeContext({ language: 'bash' })
      const sh = await sbx.runCode('X=5; echo $((X * 2))', { context: ctx })
      assert.equal(sh.logs.stdout.join(''), '10\n')
      const again = await sbx.runCode('echo $X', { context: ctx })
      assert.equal(again.logs.stdout.join(''), '5\n')
      result({ js: js.text, bash: sh.logs.stdout.join('').trim() })
    }, OPEN_CONTEXTS)
  },
}

const name = process.argv[2]
if (!cases[name]) {
  console.error(`unknown case ${name}; cases: ${Object.keys(cases).join(', ')}`)
  process.exit(64)
}
await cases[name]()
