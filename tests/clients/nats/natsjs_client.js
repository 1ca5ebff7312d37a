#!/usr/bin/env node
// nats.js 2.29.3 (the `nats` package, installed in ../node: `npm ci --prefix tests/clients/node`)
// as a NATS peer; the counterpart of natspy_client.py, with the same JSON lines on stdout:
// {"ready": true} once the subscriptions are in place, then one result line. A message is
// recorded as [subject, reply, sha256, size, headers], headers being {name: [values]} in the
// order nats.js gives them (multi-valued headers keep every value), plus "!status" when the
// message carries a status code; null without headers.
//
//   node natsjs_client.js SCENARIO --host H --port P [options] [--timeout S]
//
// Scenarios:
//   sub --subject S [--queue Q] --count N    take N messages; prints messages, in_msgs
//   pub --subject S --bodies FILE [--headers JSON]
//                                            publish each body; JSON is {name: [values]};
//                                            prints published
//   reply --subject S --count N              answer N requests with "re:" + body, echoing the
//                                            request's headers; prints answered, reply_subjects
//   request --subject S --bodies FILE --concurrency K [--headers JSON]
//                                            one request per body, K in flight; prints replies
//                                            ([sha256, headers] or "!code" per body)
//   unsub-max --subject S --max M --publish P
//                                            as in natspy_client.py: subscribe({max: M}); P
//                                            messages then S.end, twice; prints delivered,
//                                            in_msgs_1, in_msgs_2
//   no-responders --subject S                a request (muxed inbox) and a noMux request to a
//                                            subject nobody serves; prints [error code, seconds]
//
// nats.js writes SUB and PING in order, so subscribe(); flush() is a real round trip after SUB.
'use strict'

const crypto = require('crypto')
const fs = require('fs')
const path = require('path')
const nats = require(path.join(__dirname, '..', 'node', 'node_modules', 'nats'))

const INT_OPTIONS = ['port', 'count', 'concurrency', 'max', 'publish', 'timeout']

function parseArgs(argv) {
  const args = {
    scenario: argv[0],
    host: '127.0.0.1',
    port: 4222,
    subject: 'test',
    queue: '',
    count: 1,
    bodies: null,
    headers: null,
    concurrency: 50,
    max: 5,
    publish: 10,
    timeout: 60,
    tlsca: '',  // a CA file: connect with TLS, trusting it
    tlscert: '',  // a client certificate and its key (tls_verify)
    tlskey: '',
  }
  for (let i = 1; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '')
    if (!(key in args) || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}`)
    args[key] = INT_OPTIONS.includes(key) ? Number(argv[i + 1]) : argv[i + 1]
  }
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

const sha = (data) => crypto.createHash('sha256').update(data).digest('hex')
const emit = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')
// stdout into a pipe is asynchronous: exit only once the result line is written
const finish = (obj, code) => process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code))

function makeHeaders(json) {
  if (!json) return undefined
  const h = nats.headers()
  for (const [name, values] of Object.entries(JSON.parse(json))) {
    for (const v of values) h.append(name, v)
  }
  return h
}

function headersOf(m) {
  if (!m.headers) return null
  const out = {}
  for (const k of m.headers.keys()) out[k] = m.headers.values(k)
  if (m.headers.code) out['!status'] = m.headers.code
  return out
}

const record = (m) => [m.subject, m.reply || '', sha(m.data), m.data.length, headersOf(m)]

async function connect(args, out, name) {
  const options = {servers: `${args.host}:${args.port}`, name, reconnect: false}
  if (args.tlsca) options.tls = {caFile: args.tlsca}
  if (args.tlscert) Object.assign(options.tls, {certFile: args.tlscert, keyFile: args.tlskey})
  const nc = await nats.connect(options)
  ;(async () => {
    for await (const s of nc.status()) {
      if (s.type === 'error' || s.type === 'disconnect') out.async_errors.push(`${name}: ${s.type} ${s.data}`)
    }
  })()
  const info = nc.info || {}
  if (!out.server_info) out.server_info = {proto: info.proto, headers: info.headers, max_payload: info.max_payload}
  return nc
}

async function ready(...conns) {
  for (const nc of conns) await nc.flush()
  emit({ready: true})
}

async function sub(args, out) {
  const nc = await connect(args, out, 'sub')
  const s = nc.subscribe(args.subject, args.queue ? {queue: args.queue} : {})
  await ready(nc)
  out.messages = []
  if (args.count > 0) {
    for await (const m of s) {
      out.messages.push(record(m))
      if (out.messages.length >= args.count) break
    }
  }
  await nc.flush()
  out.in_msgs = nc.stats().inMsgs
  await nc.close()
}

async function pub(args, out) {
  const nc = await connect(args, out, 'pub')
  const h = makeHeaders(args.headers)
  out.published = 0
  for (const body of readBodies(args.bodies)) {
    nc.publish(args.subject, body, h ? {headers: h} : undefined)
    out.published += 1
  }
  await nc.flush()
  await nc.close()
}

async function reply(args, out) {
  const nc = await connect(args, out, 'responder')
  const s = nc.subscribe(args.subject, args.queue ? {queue: args.queue} : {})
  await ready(nc)
  out.answered = []
  out.reply_subjects = []
  for await (const m of s) {
    out.answered.push(m.subject)
    out.reply_subjects.push(m.reply)
    const body = Buffer.concat([Buffer.from('re:'), m.data])
    m.respond(body, m.headers ? {headers: m.headers} : undefined)
    if (out.answered.length >= args.count) break
  }
  await nc.flush()
  await nc.close()
}

async function request(args, out) {
  const bodies = readBodies(args.bodies)
  const h = makeHeaders(args.headers)
  const nc = await connect(args, out, 'requester')
  out.replies = new Array(bodies.length).fill(null)
  let next = 0
  async function worker() {
    while (next < bodies.length) {
      const i = next++
      try {
        const opts = {timeout: 10000}
        if (h) opts.headers = h
        const m = await nc.request(args.subject, bodies[i], opts)
        out.replies[i] = [sha(m.data), headersOf(m)]
      } catch (err) {
        out.replies[i] = `!${err.code}`
      }
    }
  }
  await Promise.all(Array.from({length: args.concurrency}, worker))
  await nc.close()
}

async function unsubMax(args, out) {
  const nc = await connect(args, out, 'sub')
  const s = nc.subscribe(args.subject, {max: args.max})
  const end = nc.subscribe(args.subject + '.end')
  await ready(nc)
  const delivered = []
  const draining = (async () => {
    for await (const m of s) delivered.push(Buffer.from(m.data).toString())
  })()
  const ends = end[Symbol.asyncIterator]()
  const pubNc = await connect(args, out, 'pub')
  for (const round of [1, 2]) {
    for (let i = 0; i < args.publish; i++) pubNc.publish(args.subject, Buffer.from(`${round}.${i}`))
    pubNc.publish(args.subject + '.end', Buffer.from(`end${round}`))
    await pubNc.flush()
    await ends.next()
    out[`in_msgs_${round}`] = nc.stats().inMsgs
  }
  await draining // the subscription ends after `max` messages
  out.delivered = delivered
  await Promise.all([nc.close(), pubNc.close()])
}

async function noResponders(args, out) {
  const nc = await connect(args, out, 'requester')
  out.requests = []
  for (const noMux of [false, true]) {
    const start = process.hrtime.bigint()
    const seconds = () => Number(process.hrtime.bigint() - start) / 1e9
    try {
      const m = await nc.request(args.subject, Buffer.from('anyone?'), {timeout: 5000, noMux})
      out.requests.push([`reply ${m.data.length} bytes ${JSON.stringify(headersOf(m))}`, seconds()])
    } catch (err) {
      out.requests.push([String(err.code), seconds()])
    }
  }
  await nc.close()
}

const SCENARIOS = {
  sub,
  pub,
  reply,
  request,
  'unsub-max': unsubMax,
  'no-responders': noResponders,
}

async function main() {
  const args = parseArgs(process.argv.slice(2))
  const scenario = SCENARIOS[args.scenario]
  if (!scenario) throw new Error(`unknown scenario ${args.scenario}`)
  const out = {async_errors: [], timed_out: false}
  const timer = setTimeout(() => {
    out.timed_out = true
    finish(out, 1)
  }, args.timeout * 1000)
  try {
    await scenario(args, out)
  } catch (err) {
    out.error = `${err.code || err.name}: ${err.message}`
  }
  clearTimeout(timer)
  finish(out, out.error ? 1 : 0)
}

main()
