# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_models)
"""Where the sglang_model module reads a model's files from: a directory on the node (NFS and
the like) or an HTTP(S) mirror of plain files (URL + "/" + path). Both read a file from a byte
offset, which is how an interrupted fetch is resumed (HTTP: a Range request)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os

from ansible.module_utils.six.moves.urllib.parse import quote
from ansible.module_utils.urls import open_url


class SourceError(Exception):
    """A source that cannot give a file, naming the source and the file."""


class DirectorySource:
    """Files of a folder on the node."""

    def __init__(self, spec):
        self.root = spec["path"]

    def describe(self):
        return {"type": "dir", "path": self.root}

    def open(self, path, offset=0):
        """(binary stream positioned at ``offset``, offset it really starts at)."""
        full = os.path.join(self.root, path)
        try:
            handle = open(full, "rb")  # pylint: disable=consider-using-with
        except (IOError, OSError) as exc:
            raise SourceError("cannot read %s from the directory source: %s" % (full, exc))
        handle.seek(offset)
        return handle, offset

    def read_range(self, path, offset, length):
        stream, _start = self.open(path, offset)
        with stream:
            return stream.read(length)


class HttpSource:
    """Plain files under a base URL (a web server, an object store's HTTP endpoint)."""

    def __init__(self, spec):
        self.base = spec["url"].rstrip("/")
        self.validate_certs = spec.get("validate_certs", True)
        self.timeout = spec.get("timeout") or 60
        self.headers = spec.get("headers") or {}

    def describe(self):
        return {"type": "http", "url": self.base}

    def url(self, path):
        return "%s/%s" % (self.base, quote(path))

    def _get(self, path, first, last=None):
        headers = dict(self.headers)
        if first or last is not None:
            headers["Range"] = "bytes=%d-%s" % (first, "" if last is None else last)
        try:
            return open_url(self.url(path), headers=headers, validate_certs=self.validate_certs,
                            timeout=self.timeout, follow_redirects="safe")
        except Exception as exc:  # pylint: disable=broad-except  # urllib, socket and ssl errors alike
            raise SourceError("cannot fetch %s: %s" % (self.url(path), exc))

    def open(self, path, offset=0):
        """(response positioned at ``offset``, offset it really starts at): a server that ignores
        Range answers 200 with the whole file, and the fetch starts over from byte 0."""
        response = self._get(path, offset)
        if offset and getattr(response, "status", response.getcode()) != 206:
            return response, 0
        return response, offset

    def read_range(self, path, offset, length):
        response = self._get(path, offset, offset + length - 1)
        with response:
            data = response.read()
        if getattr(response, "status", response.getcode()) != 206:
            data = data[offset:offset + length]
        return data


def make_source(spec):
    """The reader for an inventory source ({type: dir, path} or {type: http, url}); None for none."""
    kind = (spec or {}).get("type", "none")
    if kind == "dir":
        return DirectorySource(spec)
    if kind == "http":
        return HttpSource(spec)
    return None
