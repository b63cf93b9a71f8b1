// E2B's JS SDK, unchanged (npm e2b, pinned in package.json), against zygote (issue 35).
//
// Run by scripts/e2b-test.sh, which starts a private zygoted and sets E2B_API_URL
// (http://127.0.0.1:<api>/e2b), E2B_API_KEY (the daemon token), E2B_SANDBOX_URL
// (http://127.0.0.1:<proxy>) and E2B_TEST_TEMPLATE (a zygote image with bash).
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'

import {
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  NotFoundError,
  Sandbox,
  SandboxNotFoundError,
} from 'e2b'

const TEMPLATE = process.env.E2B_TEST_TEMPLATE ?? 'base'
const OPTS = { timeoutMs: 600_000, metadata: { suite: 'e2b-compat-js' } }

let sbx
before(async () => {
  sbx = await Sandbox.create(TEMPLATE, OPTS)
})
after(async () => {
  await sbx?.kill()
})

test('commands.run streams stdout and returns the exit code', async () => {
  const chunks = []
  const r = await sbx.commands.run('echo hi; echo there', { onStdout: (d) => chunks.push(d) })
  assert.equal(r.stdout, 'hi\nthere\n')
  assert.equal(r.stderr, '')
  assert.equal(r.exitCode, 0)
  assert.equal(chunks.join(''), 'hi\nthere\n')
})

test('a failing command throws CommandExitError with its output', async () => {
  await assert.rejects(sbx.commands.run('echo out; echo bad >&2; exit 7'), (e) => {
    assert.ok(e instanceof CommandExitError, String(e))
    assert.equal(e.exitCode, 7)
    assert.equal(e.stdout, 'out\n')
    assert.equal(e.stderr, 'bad\n')
    return true
  })
})

test('files.write then files.read, and a missing file', async () => {
  const info = await sbx.files.write('/tmp/e2b-js/a.txt', 'x\ny')
  assert.equal(info.path, '/tmp/e2b-js/a.txt')
  assert.equal(info.name, 'a.txt')
  assert.equal(await sbx.files.read('/tmp/e2b-js/a.txt'), 'x\ny')
  const bytes = await sbx.files.read('/tmp/e2b-js/a.txt', { format: 'bytes' })
  assert.deepEqual(Array.from(bytes), Array.from(Buffer.from('x\ny')))
  assert.equal((await sbx.commands.run('cat /tmp/e2b-js/a.txt')).stdout, 'x\ny')
  await assert.rejects(sbx.files.read('/tmp/e2b-js/missing'), FileNotFoundError)
})

test('background commands: list, sendStdin, kill', async () => {
  const h = await sbx.commands.run('read line; echo got:$line', { background: true, stdin: true })
  assert.ok(h.pid > 0)
  const listed = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(listed.includes(h.pid), `${h.pid} in ${listed}`)
  await sbx.commands.sendStdin(h.pid, 'data\n')
  const r = await h.wait()
  assert.equal(r.stdout, 'got:data\n')

  const sleeper = await sbx.commands.run('sleep 30', { background: true })
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(sleeper.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(sleeper.pid), false, 'a gone pid is not found')
  await assert.rejects(sbx.commands.sendStdin(999999, 'x'), NotFoundError)
})

test('getInfo, connect by id, isRunning', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, TEMPLATE)
  assert.deepEqual(info.metadata, OPTS.metadata)
  assert.equal(info.state, 'running')
  assert.equal(await sbx.isRunning(), true)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo $((6 * 7))')).stdout, '42\n')
})

test('getMetrics answers samples with their fields', async () => {
  // The daemon samples every 5 s unless told otherwise.
  let got = []
  for (const deadline = Date.now() + 60_000; got.length === 0 && Date.now() < deadline; ) {
    got = await sbx.getMetrics()
    if (got.length === 0) await new Promise((r) => setTimeout(r, 500))
  }
  const last = got.at(-1)
  assert.ok(last, 'no metrics within 60 s')
  assert.ok(last.timestamp instanceof Date && !Number.isNaN(last.timestamp.getTime()))
  assert.ok(last.cpuCount >= 1 && last.cpuUsedPct >= 0 && last.cpuUsedPct <= 100)
  assert.ok(last.memUsed > 0 && last.memUsed <= last.memTotal && last.memCache <= last.memTotal)
  assert.ok(last.diskUsed > 0 && last.diskUsed <= last.diskTotal)
  const one = await sbx.getMetrics({ start: last.timestamp, end: last.timestamp })
  assert.ok(one.length > 0 && one.every((m) => m.timestamp.getTime() === last.timestamp.getTime()))
  await assert.rejects(Sandbox.getMetrics('sb-000000000000'), SandboxNotFoundError)
})

test('kill ends a sandbox; a second kill finds nothing', async () => {
  const s = await Sandbox.create(TEMPLATE, OPTS)
  assert.equal(await s.kill(), true)
  assert.equal(await s.isRunning(), false)
  assert.equal(await Sandbox.kill(s.sandboxId), false)
})

test('a wrong API key is refused', async () => {
  await assert.rejects(Sandbox.create(TEMPLATE, { apiKey: 'e2b_wrong' }), AuthenticationError)
})
