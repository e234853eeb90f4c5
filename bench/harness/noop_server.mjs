// An HTTP server that does nothing: answers every request 202 with a small JSON body
// once the request is read. The ingress scenario (ingress.py) points locust at it to
// measure the load generator's own ceiling on this machine, the most any server could
// show under it.
//
//   node bench/harness/noop_server.mjs   (prints {"port": N} once listening on 127.0.0.1)

import { createServer } from "node:http";

const HEADERS = { "content-type": "application/json", "content-length": "10" };

const server = createServer((req, res) => {
  req.on("data", () => {});
  req.on("end", () => {
    res.writeHead(202, HEADERS);
    res.end('{"id": 1}\n');
  });
});
server.keepAliveTimeout = 60_000;
process.on("SIGTERM", () => process.exit(0));
server.listen({ port: 0, host: "127.0.0.1", backlog: 4096 }, () => {
  process.stdout.write(`${JSON.stringify({ port: server.address().port })}\n`);
});
