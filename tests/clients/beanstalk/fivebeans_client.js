#!/usr/bin/env node
// fivebeans 1.5.0 as a beanstalkd peer (installed in ../node: `npm ci --prefix tests/clients/node`).
// One scenario, `basic`, the same as pystalk_client.py:
//
//   node fivebeans_client.js basic --host H --port P --tube T --bodies FILE [--timeout S]
//
// use/watch T and ignore default; every put is written at once (fivebeans pipelines: it queues a
// reply handler per command and matches replies in order); stats-tube; reserve the first job and
// stats-job it while reserved; delete it; reserve+delete the rest; stats-tube, stats and
// list-tubes. fivebeans parses each OK reply with js-yaml, so the objects printed are what js-yaml
// made of the server's YAML. Prints one JSON line: ids, jobs ([id, body_hex] in reserve order),
// stats_job, tube_before, tube_after, stats, tubes, errors, timed_out.
'use strict'

const fs = require('fs')
const path = require('path')
const FiveBeans = require(path.join(__dirname, '..', 'node', 'node_modules', 'fivebeans')).client

function parseArgs(argv) {
  const args = {scenario: argv[0], host: '127.0.0.1', port: 0, tube: 'default', bodies: null, timeout: 60}
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '')
    if (!(key in args) || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}`)
    args[key] = ['port', 'timeout'].includes(key) ? Number(argv[i + 1]) : argv[i + 1]
  }
  if (args.scenario !== 'basic') throw new Error('scenario must be basic')
  return args
}

function readBodies(file) {
  const data = fs.readFileSync(file)
  const bodies = []
  let pos = 0
  while (pos < data.length) {
    const size = data.readUInt32BE(pos)
    pos += 4
    bodies.push(data.subarray(pos, pos + size))
    pos += size
  }
  return bodies
}

// fivebeans calls back (err, ...values); a promise of the values (one value unwrapped)
function call(client, method, ...args) {
  return new Promise((resolve, reject) => {
    client[method](...args, (err, ...values) => {
      if (err) reject(new Error(`${method}: ${err}`))
      else resolve(values.length === 1 ? values[0] : values)
    })
  })
}

async function basic(args, client, out) {
  const bodies = readBodies(args.bodies)
  await call(client, 'use', args.tube)
  await call(client, 'watch', args.tube)
  await call(client, 'ignore', 'default')
  // all the puts in flight at once
  out.ids = (await Promise.all(bodies.map((b) => call(client, 'put', 100, 0, 60, b)))).map(Number)
  out.tube_before = await call(client, 'stats_tube', args.tube)
  for (let i = 0; i < bodies.length; i++) {
    let id, payload
    try {
      ;[id, payload] = await call(client, 'reserve_with_timeout', 5)
    } catch (err) {
      out.timed_out = true
      out.errors.push(String(err))
      break
    }
    if (i === 0) out.stats_job = await call(client, 'stats_job', id)
    await call(client, 'destroy', id)
    out.jobs.push([Number(id), payload.toString('hex')])
  }
  out.tube_after = await call(client, 'stats_tube', args.tube)
  out.stats = await call(client, 'stats')
  out.tubes = await call(client, 'list_tubes')
}

async function main() {
  const args = parseArgs(process.argv.slice(2))
  const out = {ids: [], jobs: [], errors: [], timed_out: false}
  const client = new FiveBeans(args.host, args.port)
  const timer = setTimeout(() => {
    out.timed_out = true
    out.errors.push('script timed out')
    process.stdout.write(JSON.stringify(out) + '\n')
    process.exit(1)
  }, args.timeout * 1000)
  client.on('error', (err) => out.errors.push(`connection error: ${err}`))
  await new Promise((resolve, reject) => {
    client.once('connect', resolve)
    client.once('error', reject)
    client.connect()
  })
  try {
    await basic(args, client, out)
  } catch (err) {
    out.errors.push(String(err))
  }
  clearTimeout(timer)
  client.end()
  process.stdout.write(JSON.stringify(out) + '\n')
  process.exitCode = out.errors.length ? 1 : 0
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n')
  process.exit(2)
})
