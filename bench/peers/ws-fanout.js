// Baseline (c): the same fan-out as bench/rawfanout.py, with the `ws` package's
// plain per-client `send` — the server most users would pick instead.
//
//   node ws-fanout.js --clients N --messages M [--size BYTES] [--port P]
//
// Prints `PORT <n>` once listening and, when every frame is flushed, one JSON
// line with the same fields as bench.rawfanout.ServerStats.
"use strict";
const { WebSocketServer } = require("ws");

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : dflt;
}

const clients = arg("clients", 0);
const messages = arg("messages", 0);
const size = arg("size", 230);
const port = arg("port", 0);
const burst = Math.max(1, arg("burst", 1));
const HIGH_WATER = 4 * 1024 * 1024;
const errors = [];

function envelope(seq, tNs) {
  const head = `{"type":"message","scopeId":"scp_bench","message":{"seq":${seq},"content":"`;
  const body = `@bt:${tNs}`;
  const tail = '"}}';
  const pad = Math.max(0, size - head.length - body.length - tail.length - 1);
  return `${head}${body} ${"x".repeat(pad)}${tail}`;
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

const wss = new WebSocketServer({ host: "127.0.0.1", port, backlog: 4096, perMessageDeflate: false });
const conns = [];
let started = false;

wss.on("listening", () => {
  process.stdout.write(`PORT ${wss.address().port}\n`);
});
wss.on("error", (e) => {
  process.stderr.write(`ws-fanout: ${e}\n`);
  process.exit(1);
});
wss.on("connection", (ws) => {
  ws.on("error", (e) => errors.length < 10 && errors.push(String(e)));
  conns.push(ws);
  if (conns.length >= clients && !started) {
    started = true;
    broadcast().catch((e) => {
      process.stderr.write(`ws-fanout: ${e.stack}\n`);
      process.exit(1);
    });
  }
});

async function broadcast() {
  const tFirst = process.hrtime.bigint();
  let frameBytes = 0;
  for (let seq = 1; seq <= messages; seq++) {
    const payload = envelope(seq, process.hrtime.bigint());
    frameBytes = Buffer.byteLength(payload) + 4;
    for (const ws of conns) ws.send(payload);
    if (seq % burst && seq !== messages) continue;
    while (conns.some((ws) => ws.bufferedAmount > HIGH_WATER)) await tick();
    await tick();
  }
  const tLast = process.hrtime.bigint();
  const deadline = Date.now() + 120000;
  while (conns.some((ws) => ws.bufferedAmount > 0) && Date.now() < deadline) await tick();
  const tFlushed = process.hrtime.bigint();
  const cpu = process.cpuUsage();
  const stats = {
    clients: conns.length,
    messages,
    frame_bytes: frameBytes,
    t_first_ns: tFirst.toString(),
    t_last_ns: tLast.toString(),
    t_flushed_ns: tFlushed.toString(),
    cpu_s: (cpu.user + cpu.system) / 1e6,
    errors,
  };
  process.stdout.write(JSON.stringify(stats) + "\n");
  for (const ws of conns) ws.terminate();
  wss.close();
  setTimeout(() => process.exit(0), 200);
}
