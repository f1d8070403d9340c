#!/usr/bin/env python3
"""TEST DOUBLE of the Hugging Face Hub: one model repository at one commit, and only the routes
huggingface_hub 0.36.2 uses for a pinned revision (read in its file_download.py and hf_api.py).

    hf_hub_double.py FOLDER --repo OWNER/NAME --commit SHA40 [--token T] [--bind A] [--port P] [--log F]

- GET /api/models/OWNER/NAME/revision/SHA40[?blobs=true]: HfApi.model_info(files_metadata=True),
  the file list with size, git blob id and, for LFS files (*.safetensors, *.bin), sha256.
- HEAD and GET /OWNER/NAME/resolve/SHA40/PATH: hf_hub_download's metadata request (X-Repo-Commit,
  ETag / X-Linked-Etag, X-Linked-Size) and the download (byte ranges, for its resume).
Any other revision (a branch name included) answers 404 with X-Error-Code RevisionNotFound; with
--token, a request without "Authorization: Bearer T" answers 401. Requests are logged as JSON
lines, with whether they carried the token. Prints "listening on PORT".
"""

import argparse
import hashlib
import json
import os
import sys
from urllib.parse import unquote

from model_mirror import Handler, Mirror, send_file

LFS_SUFFIXES = (".safetensors", ".bin")


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub(Mirror):
    def __init__(self, address, root, log, repo, commit, token):
        super().__init__(address, root, log, {})
        self.RequestHandlerClass = HubHandler
        self.repo, self.commit, self.token = repo, commit, token
        self.files = {}
        for folder, _dirs, names in os.walk(self.root):
            for name in names:
                full = os.path.join(folder, name)
                with open(full, "rb") as handle:
                    data = handle.read()
                self.files[os.path.relpath(full, self.root)] = {
                    "size": len(data), "blob": git_blob_id(data),
                    "sha256": hashlib.sha256(data).hexdigest() if name.endswith(LFS_SUFFIXES) else None}


class HubHandler(Handler):
    """The Hub's routes for a pinned revision; everything else is 404."""

    server: Hub

    def _serve(self, send_body):
        hub = self.server
        path = unquote(self.path.split("?", 1)[0])
        authorised = self.headers.get("Authorization") == "Bearer %s" % hub.token if hub.token else None
        entry = {"method": self.command, "path": path, "range": self.headers.get("Range"), "token": authorised}
        if hub.token and not authorised:
            return self._refuse(entry, 401, "Unauthorized")
        api = "/api/models/%s/revision/" % hub.repo
        resolve = "/%s/resolve/" % hub.repo
        if path.startswith(api) and self.command == "GET":
            if path[len(api):] != hub.commit:
                return self._refuse(entry, 404, "RevisionNotFound")
            siblings = [{"rfilename": name, "size": f["size"], "blobId": f["blob"],
                         **({"lfs": {"size": f["size"], "sha256": f["sha256"], "pointerSize": 134}}
                            if f["sha256"] else {})} for name, f in sorted(hub.files.items())]
            return self._json(entry, {"id": hub.repo, "modelId": hub.repo, "sha": hub.commit, "private": False,
                                      "siblings": siblings})
        if path.startswith(resolve):
            revision, _slash, name = path[len(resolve):].partition("/")
            if revision != hub.commit:
                return self._refuse(entry, 404, "RevisionNotFound")
            if name not in hub.files:
                return self._refuse(entry, 404, "EntryNotFound")
            f = hub.files[name]
            etag = '"%s"' % (f["sha256"] or f["blob"])
            headers = [("X-Repo-Commit", hub.commit), ("ETag", etag)]
            if f["sha256"]:
                headers += [("X-Linked-Etag", etag), ("X-Linked-Size", str(f["size"]))]
            return send_file(self, os.path.join(hub.root, name), entry, send_body, headers=headers)
        return self._refuse(entry, 404, "EntryNotFound")

    def _refuse(self, entry, status, code):
        entry["status"] = status
        self.server.record(entry)
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _json(self, entry, data):
        body = json.dumps(data).encode()
        entry["status"] = 200
        self.server.record(entry)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--repo", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--token")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log")
    args = parser.parse_args()
    hub = Hub((args.bind, args.port), args.root, args.log, args.repo, args.commit, args.token)
    print("listening on %d" % hub.server_address[1], flush=True)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
