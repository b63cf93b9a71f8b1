// E2B's code interpreter JS SDK, unchanged (npm @e2b/code-interpreter, pinned in
// package.json), against zygote (issue 37): `Sandbox.create()` asks for template
// code-interpreter-v1 (zygote's image code-interpreter, built first by
// scripts/e2b-test.sh); runCode and contexts go to port 49999, which the daemon serves.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'

import { Sandbox } from '@e2b/code-interpreter'

let sbx
before(async () => {
  sbx = await Sandbox.create({ timeoutMs: 900_000, metadata: { suite: 'e2b-compat-js' } })
})
after(async () => {
  await sbx?.kill()
})

test('runCode keeps state, streams stdout and returns the value', async () => {
  const out = []
  const first = await sbx.runCode("x = 20\nprint('hi')\nx", { onStdout: (m) => out.push(m.line) })
  assert.equal(first.error, undefined)
  assert.deepEqual(first.logs.stdout, ['hi\n'])
  assert.deepEqual(out, ['hi\n'])
  assert.equal(first.text, '20')
  const second = await sbx.runCode('x * 2')
  assert.equal(second.text, '40')
  assert.ok(second.executionCount > first.executionCount)
})

test('errors and charts', async () => {
  const err = await sbx.runCode("raise ValueError('nope')")
  assert.equal(err.error?.name, 'ValueError')
  assert.equal(err.error?.value, 'nope')
  const chart = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()')
  const png = chart.results.find((r) => r.png)?.png
  assert.ok(png, JSON.stringify(chart.results.map((r) => r.formats())))
  const raw = Buffer.from(png, 'base64')
  assert.deepEqual([...raw.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
  assert.equal(raw.subarray(12, 16).toString('latin1'), 'IHDR')
})

test('contexts are independent kernels', async () => {
  const ctx = await sbx.createCodeContext()
  assert.equal(ctx.language, 'python')
  await sbx.runCode('y = 3', { context: ctx })
  assert.equal((await sbx.runCode('y', { context: ctx })).text, '3')
  assert.equal((await sbx.runCode("'y' in dir()")).text, 'False')
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await sbx.restartCodeContext(ctx)
  assert.equal((await sbx.runCode("'y' in dir()", { context: ctx })).text, 'False')
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
})
