"""OCI images and snapshot packs the way zygoted serves them
(crates/daemon/src/api/images.rs, api/packs.rs), for the fake daemon, with a
registry modelled in memory:

- ``POST /v1/images`` pulls an image of the registry: NDJSON ``resolved``, one
  ``layer`` line per layer and state (``downloading``/``done``, or ``cached``
  when a layer is in the blob store already), ``progress``, then ``done`` with
  the image, or an ``error`` line (``image_not_found``, ``registry_unauthorized``,
  ``unsupported_platform``, ``bad_image``). A reference the daemon cannot parse,
  or a username without a password, is a 400 before any stream.
  ``GET /v1/images`` lists ``minimal`` and what was pulled (``source``, ``digest``).
- ``POST /v1/sandboxes`` naming a reference as ``image`` (or a pack's as
  ``snapshot``) pulls it first (a 404 ``image_not_found`` when the registry has
  none), then leaves the create to the other models.
- Snapshots: ``POST /v1/snapshots`` takes one of any sandbox, ``GET`` lists and
  gets them, ``DELETE`` removes one. ``GET .../export`` answers a tar (an OCI
  layout whose one blob is the pack's config, naming the snapshot), chunked;
  for a snapshot in ``cut_exports`` the body breaks off half-way, as zygoted's
  does when it cannot finish. ``POST /v1/snapshots/import?name=`` reads that tar
  back (201, a new snapshot with ``pack.source`` ``file``; 422 ``bad_image``
  for anything else). ``POST .../push`` and ``POST /v1/snapshots/pull`` stream
  ``progress`` and ``blob`` lines (``cached`` for blobs the other side has),
  then ``pushed`` or ``done``, or ``error``.

The registry wants ``auth`` (user, password) for everything when it is set."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import tarfile
from dataclasses import dataclass, field
from typing import Any, Optional

Answer = dict[str, Any]

# zygote_oci::ImageRef accepts more; this is enough to tell a reference from junk.
REFERENCE = re.compile(r"[a-z0-9]([a-z0-9._:/@-]*[a-z0-9])?")
ARTIFACT = "application/vnd.zygote.snapshot.v1"


def _error(status: int, code: str, message: str) -> Answer:
    return {"status": status, "json": {"error": {"code": code, "message": message}}}


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class RegistryImage:
    """An image the registry serves: its layers' sizes; ``arch`` and ``broken`` (a
    layer whose bytes do not match its digest) for the refusals."""

    layers: list[int]
    arch: str = "amd64"
    broken: bool = False
    user: Optional[str] = None

    def manifest(self, ref: str) -> str:
        return digest_of(f"manifest {ref} {self.layers}".encode())

    def layer_digest(self, ref: str, i: int) -> str:
        return digest_of(f"layer {ref} {i}".encode())


@dataclass
class RegistryPack:
    digest: str
    snapshot: dict[str, Any]
    blobs: list[tuple[str, int]]


@dataclass
class FakeOci:
    registry: dict[str, RegistryImage] = field(default_factory=dict)
    packs: dict[str, RegistryPack] = field(default_factory=dict)
    auth: Optional[tuple[str, str]] = None
    images: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {
                "name": "minimal",
                "sha256": "ab" * 32,
                "size_bytes": 536870912,
                "disk_bytes": 41943040,
                "description": "busybox, the agent",
                "built_at": 1700000000,
            }
        ]
    )
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Blobs this daemon has (layers pulled, packs made or pulled): cached the next time.
    blobs: set[str] = field(default_factory=set)
    # Blobs the registry has (pushed packs), so a second push sends none.
    registry_blobs: set[str] = field(default_factory=set)
    cut_exports: set[str] = field(default_factory=set)
    _ids: "itertools.count[int]" = field(default_factory=lambda: itertools.count(0xA0))

    # --- dispatch -------------------------------------------------------------

    def answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> Optional[Answer]:
        if path == "/v1/images":
            return self.pull_image(json.loads(body)) if method == "POST" else self.list_images()
        if path == "/v1/sandboxes" and method == "POST":
            return self.before_create(json.loads(body))
        if path == "/v1/snapshots":
            return self.take_snapshot(json.loads(body)) if method == "POST" else self.list_snapshots()
        if path == "/v1/snapshots/import" and method == "POST":
            return self.import_pack(query, body)
        if path == "/v1/snapshots/pull" and method == "POST":
            return self.pull_pack(json.loads(body))
        m = re.fullmatch(r"/v1/snapshots/([^/]+)(/export|/push)?", path)
        if m is None:
            return None
        sid, what = m[1], m[2]
        snap = self.snapshots.get(sid)
        if snap is None:
            return _error(404, "not_found", f'snapshot "{sid}" not found')
        if what is None:
            if method == "DELETE":
                del self.snapshots[sid]
                return {"status": 204}
            return {"status": 200, "json": snap}
        if what == "/export":
            return self.export(snap)
        return self.push(snap, json.loads(body))

    # --- images ---------------------------------------------------------------

    def list_images(self) -> Answer:
        return {"status": 200, "json": {"images": self.images, "recipes": ["minimal"]}}

    def _refused(self, req: dict[str, Any]) -> Optional[Answer]:
        """The 400 zygoted answers before any stream (bad reference, half credentials)."""
        ref = req.get("reference")
        if not isinstance(ref, str) or not REFERENCE.fullmatch(ref):
            return _error(400, "invalid_argument", f"invalid image reference {ref!r}")
        if ("username" in req) != ("password" in req):
            return _error(400, "invalid_argument", "username and password go together: give both or neither")
        return None

    def _unauthorized(self, req: dict[str, Any]) -> Optional[dict[str, str]]:
        if self.auth is None or (req.get("username"), req.get("password")) == self.auth:
            return None
        return {"type": "error", "code": "registry_unauthorized", "message": "the registry refused the credentials"}

    def pull_image(self, req: dict[str, Any]) -> Answer:
        refused = self._refused(req)
        if refused is not None:
            return refused
        events, _ = self._pull_events(req["reference"], req)
        return {"status": 200, "ndjson": events}

    def _pull_events(self, ref: str, req: dict[str, Any]) -> tuple[list[dict[str, Any]], Optional[dict[str, Any]]]:
        """The pull's lines, and the image registered (None when it failed)."""
        denied = self._unauthorized(req)
        if denied is not None:
            return [denied], None
        img = self.registry.get(ref)
        if img is None:
            return [{"type": "error", "code": "image_not_found", "message": f"{ref}: manifest unknown"}], None
        if img.arch != "amd64":
            message = f"{ref} has no linux/amd64 image (it has linux/{img.arch})"
            return [{"type": "error", "code": "unsupported_platform", "message": message}], None
        manifest = img.manifest(ref)
        events: list[dict[str, Any]] = [
            {"type": "resolved", "reference": ref, "digest": manifest, "layers": len(img.layers), "bytes": sum(img.layers)}
        ]
        for i, size in enumerate(img.layers):
            digest = img.layer_digest(ref, i)
            if digest in self.blobs:
                events.append({"type": "layer", "index": i, "digest": digest, "done": size, "total": size, "state": "cached"})
                continue
            events.append({"type": "layer", "index": i, "digest": digest, "done": 0, "total": size, "state": "downloading"})
            if img.broken:
                message = f"layer {digest}: the bytes do not match the digest"
                return events + [{"type": "error", "code": "bad_image", "message": message}], None
            events.append({"type": "layer", "index": i, "digest": digest, "done": size, "total": size, "state": "done"})
            self.blobs.add(digest)
        events.append({"type": "progress", "line": "converting to ext4"})
        image = {
            "name": ref,
            "sha256": hashlib.sha256(manifest.encode()).hexdigest(),
            "size_bytes": 1 << 30,
            "disk_bytes": sum(img.layers),
            "description": f"OCI image {ref}",
            "built_at": 1700000100,
            "source": ref,
            "digest": manifest,
        }
        self.images = [i for i in self.images if i["name"] != ref] + [image]
        events.append({"type": "done", "image": image})
        return events, image

    def before_create(self, req: dict[str, Any]) -> Optional[Answer]:
        """Pulls what a create names by reference (then the create goes on)."""
        image, snapshot = req.get("image"), req.get("snapshot")
        if isinstance(image, str) and image not in {i["name"] for i in self.images}:
            events, _ = self._pull_events(image, {})
        elif isinstance(snapshot, str) and snapshot not in self.snapshots and snapshot in self.packs:
            events = self._pull_pack_events({"reference": snapshot})
        else:
            return None
        last = events[-1]
        if last["type"] == "error":
            status = {"image_not_found": 404, "registry_unauthorized": 403, "registry_error": 502}.get(last["code"], 422)
            return _error(status, last["code"], last["message"])
        return None

    # --- snapshots ------------------------------------------------------------

    def _new_snapshot(self, name: Optional[str], source_sandbox: str, pack: Optional[dict[str, str]]) -> dict[str, Any]:
        sid = f"snap-{next(self._ids):012x}"
        snap: dict[str, Any] = {
            "id": sid,
            "name": name,
            "kind": "full",
            "runtime": "qemu",
            "source_sandbox": source_sandbox,
            "depends_on": [],
            "dependents": [],
            "mem_mib": 128,
            "vcpus": 1,
            "created_at": 1700000200,
            "size_bytes": 4096,
            "implicit": False,
            "pause_ms": 3.5,
        }
        if pack is not None:
            snap["pack"] = pack
        self.snapshots[sid] = snap
        return snap

    def take_snapshot(self, req: dict[str, Any]) -> Answer:
        return {"status": 201, "json": self._new_snapshot(req.get("name"), str(req["sandbox"]), None)}

    def list_snapshots(self) -> Answer:
        return {"status": 200, "json": {"snapshots": list(self.snapshots.values())}}

    def _blobs(self, snap: dict[str, Any]) -> list[tuple[str, int]]:
        # The base image is the same for every snapshot of it; disk and state are its own.
        return [
            (digest_of(b"image minimal"), 3000),
            (digest_of(f"disk {snap['id']}".encode()), 2000),
            (digest_of(f"state {snap['id']}".encode()), 1000),
        ]

    def tar(self, snap: dict[str, Any]) -> bytes:
        """The pack as export writes it: an OCI layout with the config as its one blob."""
        config = json.dumps({"format": 1, "snapshot": {"id": snap["id"], "name": snap["name"]}}).encode()
        index = json.dumps(
            {"schemaVersion": 2, "manifests": [{"artifactType": ARTIFACT, "digest": digest_of(config)}]}
        ).encode()
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
            for name, data in (
                ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                ("index.json", index),
                (f"blobs/sha256/{digest_of(config)[7:]}", config),
            ):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000
                t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    def export(self, snap: dict[str, Any]) -> Answer:
        data = self.tar(snap)
        if snap["id"] in self.cut_exports:
            return {"status": 200, "content_type": "application/x-tar", "chunks": [data[: len(data) // 2]], "cut": True}
        return {"status": 200, "content_type": "application/x-tar", "chunks": [data[i : i + 1000] for i in range(0, len(data), 1000)]}

    def import_pack(self, query: dict[str, str], body: bytes) -> Answer:
        try:
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as t:
                files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}  # type: ignore[union-attr]
            digest = json.loads(files["index.json"])["manifests"][0]["digest"]
            config = json.loads(files[f"blobs/sha256/{digest[7:]}"])
            if digest_of(files[f"blobs/sha256/{digest[7:]}"]) != digest:
                return _error(422, "bad_image", f"blob {digest}: the bytes do not match the digest")
        except (tarfile.TarError, KeyError, ValueError, IndexError, TypeError) as e:
            return _error(422, "bad_image", f"not a snapshot pack: {e}")
        orig = config["snapshot"]
        pack = {"source": "file", "digest": digest, "snapshot": orig["id"]}
        return {"status": 201, "json": self._new_snapshot(query.get("name", orig["name"]), orig["id"], pack)}

    def push(self, snap: dict[str, Any], req: dict[str, Any]) -> Answer:
        refused = self._refused(req)
        if refused is not None:
            return refused
        denied = self._unauthorized(req)
        if denied is not None:
            return {"status": 200, "ndjson": [{"type": "progress", "line": "packing"}, denied]}
        ref, blobs = req["reference"], self._blobs(snap)
        events: list[dict[str, Any]] = [{"type": "progress", "line": "packing"}]
        for i, (digest, size) in enumerate(blobs):
            self.blobs.add(digest)
            if digest in self.registry_blobs:
                events.append({"type": "blob", "index": i, "digest": digest, "done": size, "total": size, "state": "cached"})
                continue
            events.append({"type": "blob", "index": i, "digest": digest, "done": 0, "total": size, "state": "downloading"})
            events.append({"type": "blob", "index": i, "digest": digest, "done": size, "total": size, "state": "done"})
            self.registry_blobs.add(digest)
        manifest = digest_of(f"pack {snap['id']}".encode())
        self.packs[ref] = RegistryPack(manifest, dict(snap), blobs)
        events.append({"type": "pushed", "reference": ref, "digest": manifest, "size": sum(s for _, s in blobs)})
        return {"status": 200, "ndjson": events}

    def pull_pack(self, req: dict[str, Any]) -> Answer:
        refused = self._refused(req)
        if refused is not None:
            return refused
        return {"status": 200, "ndjson": self._pull_pack_events(req)}

    def _pull_pack_events(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        ref = req["reference"]
        denied = self._unauthorized(req)
        if denied is not None:
            return [denied]
        pack = self.packs.get(ref)
        if pack is None:
            return [{"type": "error", "code": "image_not_found", "message": f"{ref}: manifest unknown"}]
        events: list[dict[str, Any]] = [{"type": "progress", "line": f"resolved to {pack.digest}"}]
        for i, (digest, size) in enumerate(pack.blobs):
            state = "cached" if digest in self.blobs else "done"
            events.append({"type": "blob", "index": i, "digest": digest, "done": size, "total": size, "state": state})
            self.blobs.add(digest)
        orig = pack.snapshot
        origin = {"source": f"oci://{ref}", "digest": pack.digest, "snapshot": orig["id"]}
        snap = self._new_snapshot(req.get("name", orig["name"]), orig["source_sandbox"], origin)
        events.append({"type": "done", "snapshot": snap})
        return events
