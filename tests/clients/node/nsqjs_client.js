#!/usr/bin/env node
// nsqjs 0.13.0 as a peer: `pub` publishes with nsq.Writer, `sub` consumes with nsq.Reader.
// Same command line and JSON output as the Python client scripts (see ../common.py).
'use strict'

const crypto = require('crypto')
const fs = require('fs')
const nsq = require('nsqjs')

function parseArgs(argv) {
  const args = {
    mode: argv[0],
    host: '127.0.0.1',
    port: 0,
    topic: '',
    channel: 'ch',
    bodies: null,
    pub: 0,
    batch: 100,
    count: 0,
    maxInFlight: 1,
    reqFirst: false,
    noFin: false,
    msgTimeout: 0,
    snappy: false,
    deflate: false,
    tlsCa: null,
    timeout: 60,
  }
  const numbers = ['port', 'pub', 'batch', 'count', 'maxInFlight', 'msgTimeout', 'timeout']
  const flags = {'--req-first': 'reqFirst', '--no-fin': 'noFin', '--snappy': 'snappy', '--deflate': 'deflate'}
  for (let i = 1; i < argv.length; i++) {
    const arg = argv[i]
    if (flags[arg]) {
      args[flags[arg]] = true
      continue
    }
    const key = arg.replace(/^--/, '').replace(/-([a-z])/g, (_m, c) => c.toUpperCase())
    if (!(key in args) || i + 1 >= argv.length) throw new Error(`bad argument ${arg}`)
    const value = argv[++i]
    args[key] = numbers.includes(key) ? Number(value) : value
  }
  if (!['pub', 'sub'].includes(args.mode)) throw new Error('mode must be pub or sub')
  return args
}

function readBodies(path) {
  const data = fs.readFileSync(path)
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

function connOptions(args) {
  const opts = {}
  if (args.snappy) opts.snappy = true
  if (args.deflate) opts.deflate = true
  if (args.tlsCa) {
    opts.tls = true
    opts.tlsVerification = true
    opts.ca = fs.readFileSync(args.tlsCa)
  }
  return opts
}

function emit(obj, code) {
  process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code))
}

function publish(args) {
  const bodies = readBodies(args.bodies)
  const singles = bodies.slice(0, args.pub)
  const rest = bodies.slice(args.pub)
  const batches = []
  for (let i = 0; i < rest.length; i += args.batch) batches.push(rest.slice(i, i + args.batch))
  const result = {commands: singles.length + batches.length, ok: 0, errors: [], closes: 0}
  let finished = false
  const finish = () => {
    if (finished) return
    finished = true
    emit(result, result.errors.length ? 1 : 0)
  }

  const writer = new nsq.Writer(args.host, args.port, connOptions(args))
  const replied = (err) => {
    if (err) result.errors.push(String(err))
    else result.ok += 1
    if (result.ok + result.errors.length >= result.commands) finish()
  }
  writer.on('ready', () => {
    // Everything pipelined: nsqjs matches each OK to the oldest outstanding publish.
    for (const body of singles) writer.publish(args.topic, body, replied)
    for (const batch of batches) writer.publish(args.topic, batch, replied)
  })
  writer.on('error', (err) => result.errors.push(`writer error: ${err}`))
  writer.on('closed', () => {
    if (!finished) result.closes += 1
  })
  writer.connect()
  setTimeout(() => {
    result.errors.push('timed out')
    finish()
  }, args.timeout * 1000).unref()
}

function consume(args) {
  const result = {deliveries: [], fins: 0, reqs: 0, closes: 0, errors: [], timed_out: false}
  let stopping = false
  const options = {
    nsqdTCPAddresses: [`${args.host}:${args.port}`],
    maxInFlight: args.maxInFlight,
    ...connOptions(args),
  }
  if (args.msgTimeout) options.messageTimeout = args.msgTimeout
  const reader = new nsq.Reader(args.topic, args.channel, options)

  const done = () =>
    args.count > 0 && (args.noFin ? result.deliveries.length : result.fins) >= args.count

  // FIN and REQ are written on the next tick, through the snappy or deflate stream when one
  // is negotiated; exit once every socket has handed its bytes to the kernel, so the last
  // FINs are not lost.
  const pending = (rdy) => {
    const nsqd = rdy.conn // the NSQDConnection behind the reader's RDY bookkeeping
    const socket = nsqd.conn
    const compressor = nsqd.outWriter && nsqd.outWriter !== socket ? nsqd.outWriter : null
    return Boolean(
      (socket && socket.writableLength > 0) ||
        (compressor && (compressor.writableLength > 0 || compressor.readableLength > 0))
    )
  }
  const stop = (code) => {
    stopping = true
    if (reader.readerRdy.connections.some(pending)) {
      setTimeout(() => stop(code), 5)
      return
    }
    emit(result, code)
  }

  reader.on('message', (msg) => {
    const attempts = msg.attempts
    result.deliveries.push([attempts, crypto.createHash('sha256').update(msg.body).digest('hex')])
    if (args.noFin) {
      if (done()) {
        // a crash: exit at once without answering; the kernel closes the socket
        fs.writeSync(1, JSON.stringify(result) + '\n')
        process.exit(0)
      }
      return
    }
    if (args.reqFirst && attempts === 1) {
      result.reqs += 1
      msg.requeue(0, false)
      return
    }
    msg.finish()
    result.fins += 1
    if (done() && !stopping) setImmediate(() => stop(0))
  })
  reader.on('error', (err) => result.errors.push(`reader error: ${err}`))
  reader.on('nsqd_closed', () => {
    if (!stopping) result.closes += 1
  })
  if (!args.count) {
    process.stdin.on('end', () => setImmediate(() => stop(0)))
    process.stdin.resume()
  }
  reader.connect()
  setTimeout(() => {
    result.timed_out = true
    emit(result, 1)
  }, args.timeout * 1000).unref()
}

const args = parseArgs(process.argv.slice(2))
if (args.mode === 'pub') publish(args)
else consume(args)
