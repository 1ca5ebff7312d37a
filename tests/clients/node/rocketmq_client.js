'use strict';
// ali-ons (unmodified, pure JavaScript RocketMQ 4.x client) driven by the interop tests.
// Prints one JSON object per line on stdout.
//
//   node rocketmq_client.js produce '{"nameSrv":"127.0.0.1:9876","topic":"T",
//        "messages":[{"tag":"A","body":"<base64>","keys":["k1"],"props":{"p":"v"}}]}'
//   node rocketmq_client.js consume '{"nameSrv":...,"topic":"T","group":"G","subExpr":"*",
//        "count":2,"timeoutMs":20000,"retryFirst":false,"distinct":false}'
//
// `count`: messages handled successfully before the consumer closes (with `distinct`,
// distinct bodies). `retryFirst`: the first delivery of each body fails (ACTION_RETRY).
// `failAll`: every delivery fails (throws); `maxReconsumeTimes`, `rebalanceInterval`:
// ali-ons' options.
// `handleMs`: the handler takes this long per message. `ignore`: bodies (base64) that
// `distinct` does not count.
// The consumer prints `ready` once subscribed and `closed` after close(); the process
// exits by itself (ali-ons keeps timers alive after close).
const { Consumer, Producer, Message } = require('ali-ons');

const out = o => process.stdout.write(JSON.stringify(o) + '\n');
const mode = process.argv[2];
const opts = JSON.parse(process.argv[3]);
const base = { httpclient: {}, nameSrv: opts.nameSrv, instanceName: mode + process.pid };

async function produce() {
  const producer = new Producer(Object.assign({ producerGroup: opts.producerGroup || 'PID_tests' }, base));
  producer.on('error', e => out({ event: 'error', message: String(e.message).slice(0, 300) }));
  await producer.ready();
  const started = Date.now();
  let messages = opts.messages;
  if (opts.repeat) {
    // bench: the same message `repeat` times, `window` sends in flight
    messages = Array.from({ length: opts.repeat }, () => opts.messages[0]);
  }
  const window = opts.window || 1;
  let index = 0;
  async function worker() {
    while (index < messages.length) {
      const spec = messages[index++];
      const body = Buffer.from(spec.body, 'base64');
      const msg = spec.tag === undefined || spec.tag === null
        ? new Message(opts.topic, body) : new Message(opts.topic, spec.tag, body);
      if (spec.keys) msg.keys = spec.keys;
      for (const [k, v] of Object.entries(spec.props || {})) msg.properties[k] = v;
      const r = await producer.send(msg);
      if (!opts.quiet) {
        out({ event: 'sent', sendStatus: r.sendStatus, msgId: r.msgId,
              queueId: Number(r.messageQueue.queueId), queueOffset: Number(r.queueOffset) });
      }
    }
  }
  await Promise.all(Array.from({ length: window }, worker));
  out({ event: 'done', count: messages.length, seconds: (Date.now() - started) / 1000 });
  await producer.close();
}

async function consume() {
  const consumer = new Consumer(Object.assign({
    consumerGroup: opts.group,
    brokerSuspendMaxTimeMillis: opts.suspendMs || 15000,
    pullBatchSize: opts.pullBatchSize || 32,
    maxReconsumeTimes: opts.maxReconsumeTimes === undefined ? 16 : opts.maxReconsumeTimes,
    rebalanceInterval: opts.rebalanceInterval || 10000,
  }, base));
  consumer.on('error', e => out({ event: 'error', code: e.code, message: String(e.message).slice(0, 300) }));
  let handled = 0;
  let resolveDone;
  const tried = new Set();
  const distinct = new Set();
  const ignore = new Set(opts.ignore || []);
  const done = new Promise(r => { resolveDone = r; });
  let first = 0;
  consumer.subscribe(opts.topic, opts.subExpr || '*', async msg => {
    if (!first) first = Date.now();
    if (!opts.quiet) {
      out({ event: 'message', topic: msg.topic, tags: msg.tags, keys: msg.keys || null,
            body: msg.body.toString('base64'), msgId: msg.msgId, queueId: msg.queueId,
            queueOffset: Number(msg.queueOffset), reconsumeTimes: msg.reconsumeTimes,
            properties: msg.properties });
    }
    if (opts.handleMs) await new Promise(r => setTimeout(r, opts.handleMs));
    const key = msg.body.toString('base64');
    // thrown, not ACTION_RETRY: ali-ons' retry-topic handler drops the handler's return
    // value, so only a throw fails a message that is already a retry
    if (opts.failAll) throw new Error('fails every time (test)');
    if (opts.retryFirst && !tried.has(key)) {
      tried.add(key);
      return Consumer.ACTION_RETRY;
    }
    handled++;
    if (!ignore.has(key)) distinct.add(key);
    const reached = opts.distinct ? distinct.size : handled;
    // resolve a little later so that ali-ons records the offset before close() commits it
    if (reached >= opts.count) setTimeout(resolveDone, 200);
  });
  await consumer.ready();
  out({ event: 'ready' });
  await Promise.race([done, new Promise(r => setTimeout(r, opts.timeoutMs || 20000))]);
  const seconds = first ? (Date.now() - first) / 1000 : 0;
  await consumer.close();
  out({ event: 'closed', count: handled, distinct: distinct.size, seconds });
  const reached = opts.distinct ? distinct.size : handled;
  process.exit(reached >= opts.count ? 0 : 3);
}

(mode === 'produce' ? produce() : consume()).then(() => process.exit(0), e => {
  out({ event: 'fatal', code: e.code, message: String(e.message).slice(0, 300) });
  process.exit(2);
});
