"""Builds small OCI image layouts and `docker save` tarballs in memory, for
the import tests (no registry is reachable): layers are tar (optionally
gzip) streams made with tarfile, blobs are named by their sha256.

    layer = make_layer([file("bin/sh", data, 0o755), whiteout("etc/old")])
    tar = oci_archive([layer], config(env=["A=1"], workdir="/app"))
"""

import gzip as gz
import hashlib
import io
import json
import tarfile


def _info(name, kind, **kw):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = kw.get("mode", 0o644)
    ti.uid = kw.get("uid", 0)
    ti.gid = kw.get("gid", 0)
    ti.mtime = 1700000000
    if "linkname" in kw:
        ti.linkname = kw["linkname"]
    if "pax" in kw:
        ti.pax_headers = kw["pax"]
    return ti


def file(name, data=b"", mode=0o644, uid=0, gid=0, pax=None):
    ti = _info(name, tarfile.REGTYPE, mode=mode, uid=uid, gid=gid, pax=pax or {})
    ti.size = len(data)
    return ti, data


def directory(name, mode=0o755, uid=0, gid=0):
    return _info(name, tarfile.DIRTYPE, mode=mode, uid=uid, gid=gid), None


def symlink(name, target):
    return _info(name, tarfile.SYMTYPE, mode=0o777, linkname=target), None


def hardlink(name, target):
    return _info(name, tarfile.LNKTYPE, linkname=target), None


def chardev(name, major=1, minor=3):
    ti = _info(name, tarfile.CHRTYPE, mode=0o666)
    ti.devmajor, ti.devminor = major, minor
    return ti, None


def whiteout(path):
    d, _, base = path.rpartition("/")
    return file((d + "/" if d else "") + ".wh." + base)


def opaque(directory_path):
    return file(directory_path.rstrip("/") + "/.wh..wh..opq")


def make_layer(entries, compress=False, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for ti, data in entries:
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gz.compress(raw, 6, mtime=0) if compress else raw


def config(env=None, workdir="", user="", entrypoint=None, cmd=None, labels=None):
    return {"architecture": "amd64", "os": "linux",
            "config": {"Env": env or [], "WorkingDir": workdir, "User": user,
                       "Entrypoint": entrypoint, "Cmd": cmd, "Labels": labels or {}},
            "rootfs": {"type": "layers", "diff_ids": []}}


def _sha(b):
    return hashlib.sha256(b).hexdigest()


def oci_files(layers, cfg, compressed=False):
    """{path: bytes} of an OCI image layout holding one image."""
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode()}
    cfg_b = json.dumps(cfg).encode()
    files["blobs/sha256/" + _sha(cfg_b)] = cfg_b
    descs = []
    for l in layers:
        files["blobs/sha256/" + _sha(l)] = l
        mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compressed else "")
        descs.append({"mediaType": mt, "digest": "sha256:" + _sha(l), "size": len(l)})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": "sha256:" + _sha(cfg_b), "size": len(cfg_b)},
                "layers": descs}
    m_b = json.dumps(manifest).encode()
    files["blobs/sha256/" + _sha(m_b)] = m_b
    files["index.json"] = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": "sha256:" + _sha(m_b), "size": len(m_b)}]}).encode()
    return files


def docker_files(layers, cfg):
    """{path: bytes} of a legacy `docker save` archive (the config's
    rootfs.diff_ids: each layer's uncompressed sha256, as docker writes them)."""
    files = {}
    cfg = dict(cfg, rootfs={"type": "layers", "diff_ids": [
        "sha256:" + _sha(gz.decompress(l) if l[:2] == b"\x1f\x8b" else l) for l in layers]})
    cfg_b = json.dumps(cfg).encode()
    files[_sha(cfg_b) + ".json"] = cfg_b
    names = []
    for l in layers:
        d = _sha(l)
        files[d + "/layer.tar"] = l
        files[d + "/VERSION"] = b"1.0"
        names.append(d + "/layer.tar")
    files["manifest.json"] = json.dumps(
        [{"Config": _sha(cfg_b) + ".json", "RepoTags": ["test:latest"], "Layers": names}]).encode()
    return files


def pack(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, data in sorted(files.items()):
            ti = tarfile.TarInfo(path)
            ti.size = len(data)
            ti.mtime = 1700000000
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def oci_archive(layers, cfg, compressed=False):
    return pack(oci_files(layers, cfg, compressed))


def docker_archive(layers, cfg):
    return pack(docker_files(layers, cfg))
