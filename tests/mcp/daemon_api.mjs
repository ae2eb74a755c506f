// The daemon's own API over its unix socket (AIRLOCK_SOCKET): what the MCP
// client tests trust when they check what a tool did.
import http from "node:http";

export function api(method, target, socketPath = process.env.AIRLOCK_SOCKET, body = undefined) {
  return new Promise((resolve, reject) => {
    const headers = body === undefined ? {} : { "Content-Type": "application/json" };
    const req = http.request({ socketPath, method, path: target, headers }, (res) => {
      let body = "";
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, body: body ? JSON.parse(body) : null }));
    });
    req.on("error", reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}
