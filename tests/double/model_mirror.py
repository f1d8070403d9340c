#!/usr/bin/env python3
"""TEST DOUBLE of an HTTP(S) model mirror: plain files of a folder, with byte ranges.

    model_mirror.py ROOT --bind ADDRESS --port PORT [--log FILE] [--cut PATH:BYTES] [--basic-auth USER:PASSWORD]
                    [--redirect BASE-URL]

GET/HEAD /PATH answers ROOT/PATH; a ``Range: bytes=FIRST-[LAST]`` request gets 206 and that
slice (what a resumed fetch asks for). Each request is appended to --log as a JSON line
(method, path, range, status), so a test can tell what was fetched and from which byte.
``--cut PATH:BYTES`` sends the first full GET of PATH with its whole Content-Length but closes
the connection after BYTES bytes: a fetch interrupted mid-file. It prints "listening on PORT"
once it accepts connections (--port 0 picks a free port). ``--basic-auth USER:PASSWORD``: a
mirror that asks for credentials, answering 401 to a request without that Authorization header
(the log's "auth" says whether the right one came, "authorization" whether any came).
``--redirect BASE-URL``: answer each (authorized) request with a 302 to BASE-URL/PATH, as a
mirror in front of an object store does.
"""

import argparse
import base64
import http.server
import json
import os
import re
import socketserver
import sys
import threading

RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Mirror(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, root, log, cuts, basic_auth=None, redirect=None):
        super().__init__(address, Handler)
        self.root = os.path.realpath(root)
        self.log_path = log
        self.cuts = cuts
        self.redirect = redirect
        self.authorization = "Basic " + base64.b64encode(basic_auth.encode()).decode() if basic_auth else None
        self.lock = threading.Lock()

    def record(self, entry):
        if self.log_path:
            with self.lock, open(self.log_path, "a") as handle:
                handle.write(json.dumps(entry) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    server: Mirror

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass  # the JSON log is the record

    def do_HEAD(self):  # pylint: disable=invalid-name
        self._serve(send_body=False)

    def do_GET(self):  # pylint: disable=invalid-name
        self._serve(send_body=True)

    def _serve(self, send_body):
        path = self.path.split("?", 1)[0].lstrip("/")
        full = os.path.realpath(os.path.join(self.server.root, path))
        requested = self.headers.get("Range")
        entry = {"method": self.command, "path": path, "range": requested,
                 "auth": self.headers.get("Authorization") == self.server.authorization,
                 "authorization": "Authorization" in self.headers}
        if self.server.authorization and not entry["auth"]:
            entry["status"] = 401
            self.server.record(entry)
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="models"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.server.redirect:
            entry["status"] = 302
            self.server.record(entry)
            self.send_response(302)
            self.send_header("Location", "%s/%s" % (self.server.redirect.rstrip("/"), path))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not full.startswith(self.server.root + os.sep) or not os.path.isfile(full):
            entry["status"] = 404
            self.server.record(entry)
            self.send_error(404)
            return
        cut = None
        if send_body and not RANGE_RE.match(requested or "") and path in self.server.cuts:
            cut = self.server.cuts.pop(path)
        send_file(self, full, entry, send_body, cut)


def send_file(handler, full, entry, send_body, cut=None, headers=()):
    """Answer with the file at ``full`` (206 and a slice for a Range request), log ``entry``;
    ``cut``: close the connection after that many bytes of the body."""
    size = os.path.getsize(full)
    requested = handler.headers.get("Range")
    first, last, status = 0, size - 1, 200
    match = RANGE_RE.match(requested or "")
    if match:
        first = int(match.group(1))
        last = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        status = 206
        if first >= size:
            entry["status"] = 416
            handler.server.record(entry)
            handler.send_response(416)
            handler.send_header("Content-Range", "bytes */%d" % size)
            handler.end_headers()
            return
    entry.update(status=status, cut=cut)
    handler.server.record(entry)
    handler.send_response(status)
    handler.send_header("Content-Length", str(last - first + 1))
    handler.send_header("Accept-Ranges", "bytes")
    for name, value in headers:
        handler.send_header(name, value)
    if status == 206:
        handler.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
    handler.end_headers()
    if not send_body:
        return
    with open(full, "rb") as stream:
        stream.seek(first)
        data = stream.read(last - first + 1)
    if cut is not None:
        handler.wfile.write(data[:cut])
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(2)
        return
    handler.wfile.write(data)

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--cut", action="append", default=[], help="PATH:BYTES")
    parser.add_argument("--basic-auth", help="USER:PASSWORD a request must carry (401 otherwise)")
    parser.add_argument("--redirect", help="BASE-URL each request is redirected to (302)")
    args = parser.parse_args()
    cuts = dict((spec.rsplit(":", 1)[0], int(spec.rsplit(":", 1)[1])) for spec in args.cut)
    server = Mirror((args.bind, args.port), args.root, args.log, cuts, args.basic_auth, args.redirect)
    print("listening on %d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
