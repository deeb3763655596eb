// The unmodified JavaScript `e2b` SDK (pinned in package.json, installed by
// scripts/setup-test-env with `npm ci`) against a running warren.
//
// Run by crates/warren/tests/e2b_js_sdk.rs, which starts `warren dev` and
// passes the exports it printed (E2B_API_URL, E2B_SANDBOX_URL and its
// generated E2B_API_KEY). Prints one line per step, then one
// `RESULT {json}` line of facts for the Rust side; exits non-zero (with the
// error) when a step fails.

import { Sandbox } from 'e2b'

const key = process.env.E2B_API_KEY ?? ''

function check(what, ok, detail) {
  if (!ok) {
    throw new Error(`${what}: ${JSON.stringify(detail)}`)
  }
  console.log(`ok   ${what}`)
}

// Versions of this SDK refuse, before sending anything, a key that is not
// `e2b_` and 40 hex digits; warren dev's generated key must pass that check.
check('the API key is in the format the SDK checks', /^e2b_[0-9a-f]{40}$/.test(key), key)

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
check('a sandbox is created', typeof sbx.sandboxId === 'string' && sbx.sandboxId.length > 0, sbx.sandboxId)

const run = await sbx.commands.run('echo "hello from $(hostname)"; id -un')
check('a command runs and its stdout comes back', run.stdout === `hello from ${sbx.sandboxId}\nuser\n`, run)
check('its exit code is 0', run.exitCode === 0, run.exitCode)

await sbx.files.write('/home/user/from-js.txt', 'written by the JavaScript SDK')
const read = await sbx.files.read('/home/user/from-js.txt')
check('a file written is read back', read === 'written by the JavaScript SDK', read)

const running = await sbx.isRunning()
check('the sandbox reports running', running === true, running)

await sbx.kill()
const listed = await Sandbox.list().nextItems()
check('a killed sandbox is no longer listed', !listed.some((s) => s.sandboxId === sbx.sandboxId), listed)
// The data plane answers E2B's 502 "The sandbox was not found", which the
// SDK reads as "not running".
const after = await sbx.isRunning()
check('a killed sandbox reports not running', after === false, after)

console.log('RESULT ' + JSON.stringify({ sandbox: sbx.sandboxId, stdout: run.stdout }))
