// A minimal HTTP server; `--check` only says it would start.
const http = require("http");
const port = Number(process.env.PORT || 8080);
if (process.argv.includes("--check")) {
  console.log(`server.js ok (NODE_ENV=${process.env.NODE_ENV}, port ${port})`);
  process.exit(0);
}
http.createServer((req, res) => res.end("hello from the example app\n")).listen(port);
