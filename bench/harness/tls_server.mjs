// Two HTTPS destinations in one Node process for the mtls-drain scenario (mtls_drain.py):
// the same certificate and the same handler, one that demands a client certificate signed
// by --ca and one that asks for none. Every POST is answered 200 at once. A plain HTTP
// port serves GET /_stats: per server the TLS handshakes (new connections) and requests,
// and the process's CPU time.
//
//   node bench/harness/tls_server.mjs --cert F --key F --ca F
//   (prints {"tls": port, "mtls": port, "stats": port} once listening on 127.0.0.1)

import { readFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:https";
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    cert: { type: "string" },
    key: { type: "string" },
    ca: { type: "string" },
  },
});
const tls = { cert: readFileSync(opts.cert), key: readFileSync(opts.key) };
const counts = { tls: { handshakes: 0, requests: 0 }, mtls: { handshakes: 0, requests: 0 } };

function destination(name, options) {
  const server = createServer(options, (req, res) => {
    req.on("data", () => {});
    req.on("end", () => {
      counts[name].requests += 1;
      res.writeHead(200, { "content-length": "2" });
      res.end("ok");
    });
  });
  server.on("secureConnection", () => { counts[name].handshakes += 1; });
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 65_000;
  return server;
}

const servers = {
  tls: destination("tls", tls),
  mtls: destination("mtls", {
    ...tls, ca: readFileSync(opts.ca), requestCert: true, rejectUnauthorized: true,
  }),
  stats: createHttpServer((req, res) => {
    const cpu = process.cpuUsage();
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ...counts, cpu_ms: (cpu.user + cpu.system) / 1000 }));
  }),
};

const ports = {};
for (const [name, server] of Object.entries(servers)) {
  server.listen({ port: 0, host: "127.0.0.1", backlog: 4096 }, () => {
    ports[name] = server.address().port;
    if (Object.keys(ports).length === 3) process.stdout.write(`${JSON.stringify(ports)}\n`);
  });
}
process.on("SIGTERM", () => process.exit(0));
