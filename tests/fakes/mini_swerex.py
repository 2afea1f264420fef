"""The two SWE-ReX routes sandlot needs to start a veFaaS sandbox and run a command, for the
chaos test's 200 fake instances (a full ``swerex.server`` takes a second of CPU to start).

Shapes of swe-rex 1.4.0 (``swerex/server.py``, ``swerex/runtime/abstract.py``): ``GET
/is_alive`` -> ``{"is_alive", "message"}``; ``POST /execute`` with a ``Command`` body ->
``CommandResponse`` ``{"stdout", "stderr", "exit_code"}``; the ``X-API-Key`` header must be the
token given as the only argument. Port: ``$SANDLOT_SWEREX_PORT``.
"""

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

TOKEN = sys.argv[1]


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.headers.get("X-API-Key") != TOKEN:
            return self.reply(401, {})
        self.reply(200, {"is_alive": True, "message": ""})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.headers.get("X-API-Key") != TOKEN:
            return self.reply(401, {})
        p = subprocess.run(
            body["command"],
            shell=body["shell"],
            capture_output=True,
            timeout=body["timeout"],
            cwd=body["cwd"],
            env=body["env"],
        )
        self.reply(
            200,
            {
                "stdout": p.stdout.decode(errors="backslashreplace"),
                "stderr": p.stderr.decode(errors="backslashreplace"),
                "exit_code": p.returncode,
            },
        )


HTTPServer(("127.0.0.1", int(os.environ["SANDLOT_SWEREX_PORT"])), H).serve_forever()
