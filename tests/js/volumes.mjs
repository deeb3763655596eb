// E2B's persistent volumes through the unmodified JavaScript `e2b` SDK
// (pinned in package.json): the volume API, the content API with the
// volume's token (E2B_VOLUME_API_URL is the gateway), and a volume
// mounted into a sandbox (`volumeMounts`, created through /v2/sandboxes).
//
// Run by crates/warren/tests/volumes.rs as `node volumes.mjs CASE`; prints
// one line per step, then `RESULT {json}`; exits non-zero when a step fails.

import { Sandbox, Volume, VolumePathNotFoundError } from 'e2b'

function check(what, ok, detail) {
  if (!ok) {
    throw new Error(`${what}: ${JSON.stringify(detail)}`)
  }
  console.log(`ok   ${what}`)
}

async function rejects(what, p) {
  try {
    await p
  } catch (e) {
    console.log(`ok   ${what} (${e.constructor.name}: ${e.message})`)
    return e
  }
  throw new Error(`${what}: did not fail`)
}

async function roundTrip() {
  const name = `js-${Date.now()}`
  const vol = await Volume.create(name)
  check('a volume is created with a token', vol.volumeId && vol.token && vol.name === name, vol)
  await rejects('a second volume of that name is refused', Volume.create(name))
  const listed = await Volume.list()
  check('it is listed', listed.some((v) => v.volumeId === vol.volumeId), listed)

  const written = await vol.writeFile('/notes/hello.txt', 'from js').catch((e) => e)
  check('a file in a missing directory is refused', written instanceof VolumePathNotFoundError, String(written))
  const dir = await vol.makeDir('/notes', { mode: 0o755 })
  check('a directory is made', dir.type === 'directory' && dir.path === '/notes', dir)
  const file = await vol.writeFile('/notes/hello.txt', 'from js', { uid: 1000, gid: 1000, mode: 0o644 })
  check('a file is written', file.type === 'file' && file.size === 7 && file.mode === 0o644, file)
  check('its times are dates', file.mtime instanceof Date && !isNaN(file.mtime), file.mtime)
  const entries = await vol.list('/', { depth: 2 })
  check('the tree lists', entries.map((e) => e.path).sort().join(',') === '/notes,/notes/hello.txt', entries)
  check('it reads back', (await vol.readFile('/notes/hello.txt')) === 'from js', null)
  const bytes = await vol.readFile('/notes/hello.txt', { format: 'bytes' })
  check('it reads back as bytes', new TextDecoder().decode(bytes) === 'from js', bytes.length)

  const sbx = await Sandbox.create('base', {
    timeoutMs: 240_000,
    allowInternetAccess: false,
    volumeMounts: { '/mnt/vol': vol },
  })
  const inside = await sbx.files.read('/mnt/vol/notes/hello.txt')
  check('the sandbox reads what the API wrote', inside === 'from js', inside)
  await sbx.files.write('/mnt/vol/notes/from-sandbox.txt', 'written inside')
  const run = await sbx.commands.run('stat -c "%U" /mnt/vol/notes/from-sandbox.txt')
  check('what the sandbox writes is its user\'s', run.stdout.trim() === 'user', run)
  check('the API reads what the sandbox wrote', (await vol.readFile('/notes/from-sandbox.txt')) === 'written inside', null)
  const info = await Sandbox.getInfo(sbx.sandboxId)
  check('the sandbox lists its volume mount', JSON.stringify(info.volumeMounts) === JSON.stringify([{ name, path: '/mnt/vol' }]), info.volumeMounts)

  await rejects('a mounted volume is not destroyed', Volume.destroy(vol.volumeId))
  await sbx.kill()

  const meta = await vol.updateMetadata('/notes/hello.txt', { mode: 0o600 })
  check('metadata changes', meta.mode === 0o600, meta)
  await vol.remove('/notes')
  check('a removed directory is gone', !(await vol.exists('/notes')), null)
  check('the volume is destroyed', (await Volume.destroy(vol.volumeId)) === true, null)
  await rejects('a destroyed volume is not found', Volume.getInfo(vol.volumeId))
  console.log('RESULT ' + JSON.stringify({ volume: vol.volumeId, sandbox: sbx.sandboxId }))
}

const cases = { round_trip: roundTrip }
await cases[process.argv[2]]()
