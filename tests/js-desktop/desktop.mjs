// What a user of the unmodified `@e2b/desktop` JavaScript SDK (pinned in
// package-lock.json) notices against warren, and what a person sees who
// opens a desktop sandbox's stream in a real browser.
//
// Run by crates/warren/tests/desktop.rs, one case per invocation:
//
//     node desktop.mjs CASE
//
// with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set. Each case asserts
// what the user sees and prints one JSON line of facts (`RESULT {...}`); it
// exits non-zero on a failed assertion.
//
// `sdk`: the SDK's calls on a desktop of the default size, their effects
// read from a probe window the test draws (tests/e2b/desktop_probe.tcl:
// it logs what the X server delivered and changes colour on a click).
//
// `browser`: the stream URL (`stream.getUrl()`) opened in the machine's
// Chromium (/usr/bin/chromium, headless, driven by playwright-core), as a
// user opens it: https through the gateway's TLS listener
// (DESKTOP_TLS_PORT, its certificate in DESKTOP_TLS_CERT), by the sandbox's
// host name. Chromium resolves `*.{domain}` to that listener
// (`--host-resolver-rules`, which may also rewrite the port) and accepts
// exactly that certificate's key (`--ignore-certificate-errors-spki-list`),
// so the URL is the SDK's, unchanged, and no fixed port is bound. The
// test finds in Chromium's screenshots the colours it paints in the
// sandbox; keeps the stream idle for DESKTOP_IDLE_SECS (longer than the
// gateway's and node's --idle-timeout) and sees the next frame on the
// same WebSocket; then a password stream refuses a wrong password and
// shows the desktop with the right one. DESKTOP_SCREENSHOT, when set, is
// where a screenshot of the stream is written (docs/desktop.png).

import assert from 'node:assert/strict'
import { createHash, X509Certificate } from 'node:crypto'
import { readFileSync, writeFileSync } from 'node:fs'
import { Sandbox } from '@e2b/desktop'
import { chromium } from 'playwright-core'
import { PNG } from 'pngjs'

const here = (file) => new URL(file, import.meta.url)
const PROBE = readFileSync(here('../e2b/desktop_probe.tcl'), 'utf8')
const RFB_HELLO = readFileSync(here('../e2b/rfb_hello.py'), 'utf8')
const MAGENTA = [255, 0, 255]
const CYAN = [0, 255, 255]
const YELLOW = [255, 255, 0]

function result(facts) {
  console.log('RESULT ' + JSON.stringify(facts))
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// `probe()`'s first truthy answer, or an AssertionError after `withinMs`.
async function waitFor(what, probe, withinMs = 60_000, everyMs = 500) {
  const deadline = Date.now() + withinMs
  for (;;) {
    const got = await probe()
    if (got) return got
    assert.ok(Date.now() < deadline, `${what}: not within ${withinMs} ms`)
    await sleep(everyMs)
  }
}

// A command's stdout, or null when it failed.
async function output(sbx, cmd) {
  try {
    return (await sbx.commands.run(cmd)).stdout
  } catch {
    return null
  }
}

function png(bytes) {
  return PNG.sync.read(Buffer.from(bytes))
}

function pixel(img, x, y) {
  const i = (img.width * y + x) * 4
  return [img.data[i], img.data[i + 1], img.data[i + 2]]
}

const near = (p, colour, slack = 24) => p.every((v, i) => Math.abs(v - colour[i]) <= slack)

// The share of an image's pixels that are `colour` (within a little, for
// a stream's lossy encodings).
function share(img, colour) {
  let n = 0
  for (let y = 0; y < img.height; y++) {
    for (let x = 0; x < img.width; x++) if (near(pixel(img, x, y), colour)) n++
  }
  return n / (img.width * img.height)
}

// The probe window (desktop_probe.tcl) in the sandbox.
async function startProbe(sbx, geometry, colours, log = '/tmp/probe.log') {
  await sbx.files.write('/tmp/desktop_probe.tcl', PROBE)
  const args = [log, geometry, ...colours].map((a) => `'${a}'`).join(' ')
  await sbx.commands.run(`wish /tmp/desktop_probe.tcl -name probe ${args}`, {
    background: true,
    timeoutMs: 0,
  })
  const lines = async () => ((await output(sbx, `cat ${log}`)) ?? '').split('\n')
  const ready = await waitFor('the probe window', async () =>
    (await lines()).find((l) => l.startsWith('ready ')),
  )
  const [w, h, x, y] = ready.match(/^ready (\d+)x(\d+)\+(\d+)\+(\d+)$/).slice(1).map(Number)
  return {
    width: w,
    height: h,
    at: (dx, dy) => [x + dx, y + dy],
    events: async (kind) =>
      (await lines()).map((l) => l.split(' ')).filter((f) => f[0] === kind).map((f) => f.slice(1)),
  }
}

// `stream.stop()`, then waits until x11vnc and noVNC are gone: stop returns
// once it has signalled them (`pkill`), and a `start()` that still finds
// x11vnc says "Stream is already running".
async function stopStream(sbx) {
  await sbx.stream.stop()
  await waitFor('the stream to stop', async () =>
    (await output(sbx, "pgrep -x x11vnc || netstat -tln | grep -q ':6080 '")) === null,
  )
}

async function rfbHello(sbx) {
  await sbx.files.write('/tmp/rfb_hello.py', RFB_HELLO)
  return JSON.parse((await sbx.commands.run('python3 /tmp/rfb_hello.py 5900')).stdout)
}

async function create(opts = {}) {
  const start = Date.now()
  const sbx = await Sandbox.create({ timeoutMs: 600_000, ...opts })
  return [sbx, (Date.now() - start) / 1000]
}

const cases = {
  // The SDK's calls, their effects read from the screen and the probe.
  async sdk() {
    const [sbx, createSecs] = await create()
    try {
      assert.deepEqual(await sbx.getScreenSize(), { width: 1024, height: 768 })
      const first = png(await sbx.screenshot())
      assert.deepEqual([first.width, first.height], [1024, 768])

      const probe = await startProbe(sbx, '300x200+300+200', ['#ff00ff', '#00ffff'])
      const centre = probe.at(Math.floor(probe.width / 2), Math.floor(probe.height / 2))
      assert.ok(near(pixel(png(await sbx.screenshot()), ...centre), MAGENTA))
      await sbx.leftClick(...probe.at(15, 15))
      await waitFor("the click's colour in a screenshot", async () =>
        near(pixel(png(await sbx.screenshot()), ...centre), CYAN),
      )
      const [cx, cy] = probe.at(15, 15)
      assert.deepEqual(await sbx.getCursorPosition(), { x: cx, y: cy })

      await sbx.rightClick(...probe.at(20, 25))
      await sbx.middleClick(...probe.at(21, 26))
      await sbx.doubleClick(...probe.at(22, 27))
      await sbx.scroll('down', 2)
      await sbx.scroll('up')
      await sbx.drag(probe.at(5, 5), probe.at(90, 70))
      const p = (b, dx, dy) => [b, ...probe.at(dx, dy)]
      // The probe logs what the X server delivered, as it gets to it.
      const presses = await waitFor('the presses', async () => {
        const seen = (await probe.events('press')).map((e) => e.map(Number))
        return seen.length >= 9 && seen
      })
      assert.deepEqual(presses, [
        p(1, 15, 15),
        p(3, 20, 25),
        p(2, 21, 26),
        p(1, 22, 27),
        p(1, 22, 27),
        p(5, 22, 27),
        p(5, 22, 27),
        p(4, 22, 27),
        p(1, 5, 5),
      ])
      const releases = await waitFor('the drag\'s release', async () => {
        const seen = (await probe.events('release')).map((e) => e.map(Number))
        return seen.length >= 9 && seen
      })
      assert.deepEqual(releases.at(-1), p(1, 90, 70))

      const text = 'Typed by @e2b/desktop: {"json": [1, 2]} <tag> `tick` 100%'
      await sbx.write(text.slice(0, 30))
      await sbx.write(text.slice(30), { chunkSize: 6, delayInMs: 5 })
      await sbx.press('enter')
      await sbx.press(['ctrl', 'c'])
      const keys = await waitFor('the keys', async () => {
        const k = await probe.events('key')
        return k.some(([name, state]) => name === 'c' && Number(state) & 4) && k
      })
      const typed = keys
        .filter(([, , code]) => code !== '-')
        .map(([, , code]) => String.fromCodePoint(Number(code)))
        .join('')
      assert.equal(typed.split('\r')[0], text)

      const start = Date.now()
      await sbx.wait(600)
      assert.ok(Date.now() - start >= 600)

      // A terminal from `launch`; its window by class; the stream.
      await sbx.launch('xfce4-terminal')
      const windows = await waitFor('the terminal', async () => {
        try {
          return (await sbx.getApplicationWindows('xfce4-terminal')).filter(Boolean)
        } catch {
          return null
        }
      })
      assert.match(await sbx.getWindowTitle(windows[0]), /Terminal/)

      await sbx.stream.start()
      const url = sbx.stream.getUrl()
      assert.equal(url, `https://${sbx.getHost(6080)}/vnc.html?autoconnect=true&resize=scale`)
      assert.deepEqual((await rfbHello(sbx)).security, [1])
      await assert.rejects(sbx.stream.start(), /already running/)
      await stopStream(sbx)

      // One window: the stream's screen is that window.
      await sbx.stream.start({ windowId: windows[0] })
      const hello = await rfbHello(sbx)
      const geometry = await sbx.commands.run(`xdotool getwindowgeometry ${windows[0]}`)
      assert.ok(geometry.stdout.includes(`Geometry: ${hello.width}x${hello.height}`), geometry.stdout)
      await stopStream(sbx)
      // With a password (kept for every later start, as on E2B).
      await sbx.stream.start({ requireAuth: true })
      const key = sbx.stream.getAuthKey()
      assert.match(key, /^[A-Za-z0-9]{16}$/)
      assert.equal(new URL(sbx.stream.getUrl({ authKey: key })).searchParams.get('password'), key)
      assert.deepEqual((await rfbHello(sbx)).security, [2])
      await stopStream(sbx)

      result({ createSecs, presses: presses.length, typed: typed.length, url })
    } finally {
      await sbx.kill()
    }
  },

  // The stream in Chromium, through the gateway's TLS listener.
  async browser() {
    const port = process.env.DESKTOP_TLS_PORT
    const cert = readFileSync(process.env.DESKTOP_TLS_CERT, 'utf8')
    const idleSecs = Number(process.env.DESKTOP_IDLE_SECS ?? '0')
    const spki = createHash('sha256')
      .update(new X509Certificate(cert).publicKey.export({ type: 'spki', format: 'der' }))
      .digest('base64')
    const [sbx, createSecs] = await create()
    const browser = await chromium.launch({
      executablePath: '/usr/bin/chromium',
      headless: true,
      // Playwright gives it a fresh profile (--user-data-dir) and, as root
      // needs, --no-sandbox; these are the rest of what a CI browser wants.
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        `--host-resolver-rules=MAP *.${sbx.sandboxDomain} 127.0.0.1:${port}`,
        `--ignore-certificate-errors-spki-list=${spki}`,
      ],
    })
    try {
      const page = await browser.newPage({ viewport: { width: 1024, height: 768 } })
      // Every WebSocket frame's time, to show the stream was idle.
      const frames = []
      let sockets = 0
      page.on('websocket', (ws) => {
        sockets++
        ws.on('framereceived', () => frames.push(Date.now()))
        ws.on('framesent', () => frames.push(Date.now()))
      })
      const shot = async () => png(await page.screenshot())
      // What noVNC said, for a failure's message.
      const said = []
      page.on('console', (m) => said.push(`${m.type()}: ${m.text()}`))
      const status = () =>
        page.evaluate(() => [
          document.documentElement.className,
          document.getElementById('noVNC_status').textContent,
        ])
      const connected = async () => {
        try {
          await page.waitForFunction(() => document.documentElement.classList.contains('noVNC_connected'), null, {
            timeout: 120_000,
          })
        } catch (e) {
          throw new Error(`noVNC did not connect: ${JSON.stringify(await status())}; console: ${said.slice(-20).join(' | ')}`, { cause: e })
        }
      }
      const showing = (what, colour, least = 0.9) =>
        waitFor(`${what} in Chromium`, async () => share(await shot(), colour) >= least, 120_000)

      // The desktop as a person first sees it: a terminal on Xfce.
      await sbx.launch('xfce4-terminal')
      await waitFor('the terminal', async () => (await output(sbx, 'xdotool search --onlyvisible --class xfce4-terminal')) !== null)
      await sbx.wait(1000)
      await sbx.write('echo "a warren desktop, streamed"')
      await sbx.press('enter')

      await sbx.stream.start()
      const url = sbx.stream.getUrl()
      assert.ok(url.startsWith(`https://6080-${sbx.sandboxId}.${sbx.sandboxDomain}/vnc.html?`), url)
      await page.goto(url)
      await connected()
      await waitFor('the desktop in Chromium', async () => {
        // Xfce's panel and the terminal: many colours, not a blank canvas.
        const img = await shot()
        const colours = new Set()
        for (let i = 0; i < img.data.length; i += 4 * 97) colours.add(img.data.readUInt32BE(i))
        return colours.size > 200
      })
      if (process.env.DESKTOP_SCREENSHOT) writeFileSync(process.env.DESKTOP_SCREENSHOT, await page.screenshot())

      // Pixels the test paints in the sandbox reach the browser.
      await startProbe(sbx, 'full', ['#ff00ff', '#00ffff', '#ffff00'])
      await showing('the magenta probe', MAGENTA)

      // Idle longer than the listeners' idle timeout, then the next frame
      // comes over the same WebSocket.
      const quietFrom = Date.now()
      await sleep(idleSecs * 1000)
      const quietTo = Date.now()
      // The longest time no frame went either way (noVNC may still be
      // finishing the last update as the wait begins).
      const times = [quietFrom, ...frames.filter((t) => t > quietFrom && t < quietTo), quietTo]
      const silence = Math.max(...times.slice(1).map((t, i) => t - times[i])) / 1000
      await sbx.leftClick(512, 384)
      await showing('the cyan probe after the idle stream', CYAN)
      assert.equal(sockets, 1, 'noVNC kept its one WebSocket')
      assert.ok(await page.evaluate(() => document.documentElement.classList.contains('noVNC_connected')))

      // A password stream: a wrong password is refused, nothing is shown;
      // the right one shows the desktop.
      await stopStream(sbx)
      await sbx.stream.start({ requireAuth: true })
      const key = sbx.stream.getAuthKey()
      // Wrong in its first character: VNC authentication reads only the
      // first 8 (docs/desktop.md, "Limits").
      const wrong = (key.startsWith('a') ? 'b' : 'a') + key.slice(1)
      await page.goto(sbx.stream.getUrl({ authKey: wrong }))
      const refusal = await waitFor('the refusal', () =>
        page.evaluate(() => {
          const status = document.getElementById('noVNC_status')
          return status.classList.contains('noVNC_status_error') && status.textContent
        }),
      )
      assert.ok(!(await page.evaluate(() => document.documentElement.classList.contains('noVNC_connected'))))
      const refused = await shot()
      assert.ok(share(refused, CYAN) < 0.05, 'a refused stream shows no desktop')
      await sbx.leftClick(512, 384)
      await page.goto(sbx.stream.getUrl({ authKey: key }))
      await connected()
      await showing('the yellow probe with the right password', YELLOW)
      result({
        createSecs,
        url,
        idleSecs,
        silenceSecs: silence,
        refusal: refusal.trim(),
        sockets,
      })
    } finally {
      await browser.close()
      await sbx.kill()
    }
  },
}

const name = process.argv[2]
if (!cases[name]) {
  console.error(`unknown case ${name}; known: ${Object.keys(cases).join(', ')}`)
  process.exit(64)
}
await cases[name]()
