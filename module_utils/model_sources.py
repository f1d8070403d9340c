# -*- coding: utf-8 -*-
# Copyright: sglang-canon contributors
# MIT License (see galaxy_info of roles/sglang_models)
"""Where the sglang_model module reads a model's files from: a directory on the node (NFS and
the like) or an HTTP(S) mirror of plain files (URL + "/" + path). Both read a file from a byte
offset, which is how an interrupted fetch is resumed (HTTP: a Range request).

What a source may not do: a dir source gives only files inside its folder (a symbolic link that
leads out of it, to /etc/shadow say, is refused: the copy would be readable by every local user),
and credentials travel in headers of their own. That a source URL holds no credential is the
sglang_models role's refusal, on the controller, before any module is given the URL
(filter_plugins/model_source_problems.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import stat

from ansible.module_utils.six.moves.urllib.error import HTTPError
from ansible.module_utils.six.moves.urllib.parse import quote, urljoin, urlsplit
from ansible.module_utils.urls import open_url

REDIRECT_CODES = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 10


class SourceError(Exception):
    """A source that cannot give a file, naming the source and the file."""


def same_origin(url, other):
    """Whether two URLs have the same scheme, host and port (where a credential may follow a redirect)."""
    def origin(text):
        parts = urlsplit(text)
        return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return origin(url) == origin(other)


def inside(root, resolved):
    """Whether the real path ``resolved`` is ``root`` (a real path) or under it."""
    return resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep)


def link_leaving(root, path):
    """(link, its target, where it leads) of the first symbolic link on the way from ``root`` to
    ``root/path`` that leads out of ``root``, or None when every link on the way stays inside.
    Those are followed: they give nothing the source's owner could not give as a file (links to
    deduplicated blobs inside the source, say). ``root`` is a real path; the link is named under it."""
    current = root
    for part in path.split("/"):
        step = os.path.join(current, part)
        if os.path.islink(step):
            resolved = os.path.realpath(step)
            if not inside(root, resolved):
                return step, os.readlink(step), resolved
            current = resolved
        else:
            current = step
    return None


class DirectorySource:
    """Files of a folder on the node; none from outside it."""

    def __init__(self, spec, label="model"):
        self.root = spec["path"]
        self.label = label

    def describe(self):
        return {"type": "dir", "path": self.root}

    def refuse_leaving(self, path, resolved):
        """The refusal of a file of the source that resolves to ``resolved``, outside the source."""
        link, target, leads_to = link_leaving(os.path.realpath(self.root), path) or (
            os.path.join(self.root, path), "?", resolved)  # a link swapped back since: name what was opened
        return SourceError("%s: %s in the dir source %s is a symbolic link to %s, which leads to %s outside the source "
                           "folder: refused, its copy would be readable by every user of the node; a link may only "
                           "lead to a file inside %s" % (self.label, link, self.root, target, leads_to, self.root))

    def check(self, path):
        """Refuse ``path`` when it leads out of the source (a link) or is no regular file."""
        full = os.path.join(self.root, path)
        resolved = os.path.realpath(full)
        if not inside(os.path.realpath(self.root), resolved):
            raise self.refuse_leaving(path, resolved)
        return full

    def open(self, path, offset=0):
        """(binary stream positioned at ``offset``, offset it really starts at). What was opened is
        checked after opening it (the file the descriptor names), so a link swapped in between the
        check and the open is refused as well."""
        full = self.check(path)
        try:
            # Non-blocking: a FIFO put in the source would otherwise hang the open until a writer came.
            handle = os.fdopen(os.open(full, os.O_RDONLY | os.O_NONBLOCK), "rb")
        except (IOError, OSError) as exc:
            raise SourceError("cannot read %s from the directory source: %s" % (full, exc))
        opened = os.readlink("/proc/self/fd/%d" % handle.fileno())
        if not inside(os.path.realpath(self.root), opened):
            handle.close()
            raise self.refuse_leaving(path, opened)
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            handle.close()
            raise SourceError("%s: %s in the dir source is not a regular file" % (self.label, full))
        handle.seek(offset)
        return handle, offset

    def read_range(self, path, offset, length):
        stream, _start = self.open(path, offset)
        with stream:
            return stream.read(length)


class HttpSource:
    """Plain files under a base URL (a web server, an object store's HTTP endpoint)."""

    def __init__(self, spec, headers=None):
        self.base = spec["url"].rstrip("/")
        self.validate_certs = spec.get("validate_certs", True)
        self.timeout = spec.get("timeout") or 60
        self.headers = dict(headers or {})  # credentials: sent, never described

    def describe(self):
        return {"type": "http", "url": self.base}

    def url(self, path):
        return "%s/%s" % (self.base, quote(path))

    def _get(self, path, first, last=None):
        """The response for ``path``, redirects followed here rather than by urllib, which would
        send the credential headers to whatever host a redirect names (an object store, a CDN):
        they follow a redirect only to the same scheme, host and port."""
        headers = {}
        if first or last is not None:
            headers["Range"] = "bytes=%d-%s" % (first, "" if last is None else last)
        url, credentials = self.url(path), dict(self.headers)
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                return open_url(url, headers=dict(headers, **credentials), validate_certs=self.validate_certs,
                                timeout=self.timeout, follow_redirects="none")
            except HTTPError as exc:
                location = exc.headers.get("Location") if exc.code in REDIRECT_CODES and exc.headers else None
                if not location:
                    raise SourceError("cannot fetch %s: %s" % (self.url(path), exc))
                target = urljoin(url, location)
                if not same_origin(url, target):
                    credentials = {}
                url = target
            except Exception as exc:  # pylint: disable=broad-except  # urllib, socket and ssl errors alike
                raise SourceError("cannot fetch %s: %s" % (self.url(path), exc))
        raise SourceError("cannot fetch %s: more than %d redirects" % (self.url(path), MAX_REDIRECTS))

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


def make_source(spec, label="model", headers=None):
    """The reader for an inventory source ({type: dir, path} or {type: http, url}); None for none.
    ``headers`` are sent with every request of an http source (its credentials)."""
    kind = (spec or {}).get("type", "none")
    if kind == "dir":
        return DirectorySource(spec, label)
    if kind == "http":
        return HttpSource(spec, headers)
    return None
