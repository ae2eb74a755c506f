package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "bin", "busybox"), []byte("#!binary"), 0o755))
	must(os.Symlink("busybox", filepath.Join(root, "bin", "sh")))
	must(os.Link(filepath.Join(root, "bin", "busybox"), filepath.Join(root, "bin", "ash")))
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("c1\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(root, "etc", "fifo"), 0o600))
	return root
}

func entries(t *testing.T, data []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

func TestLayerIsDeterministicAndComplete(t *testing.T) {
	root := tree(t)
	var a, b bytes.Buffer
	if err := writeLayer(root, &a); err != nil {
		t.Fatal(err)
	}
	if err := writeLayer(root, &b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same tree gave two different layers")
	}
	hexsum, size, err := layerDigest(root)
	sum := sha256.Sum256(a.Bytes())
	if err != nil || hexsum != hex.EncodeToString(sum[:]) || size != int64(a.Len()) {
		t.Fatalf("layerDigest = %s %d %v, want the layer's sha256 and size %d", hexsum, size, err, a.Len())
	}
	e := entries(t, a.Bytes())
	if h := e["bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("bin/sh: %+v, want a symlink to busybox", h)
	}
	// bin/ash sorts before bin/busybox: the first name walked carries the data.
	if h := e["bin/busybox"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "bin/ash" {
		t.Errorf("bin/busybox: %+v, want a hard link to bin/ash", h)
	}
	if h := e["etc/"]; h == nil || h.Typeflag != tar.TypeDir {
		t.Errorf("etc/: %+v, want a directory", h)
	}
	if h := e["etc/fifo"]; h == nil || h.Typeflag != tar.TypeFifo {
		t.Errorf("etc/fifo: %+v, want a fifo", h)
	}
	if h := e["etc/hostname"]; h == nil || h.Size != 3 || h.Mode&0o777 != 0o644 {
		t.Errorf("etc/hostname: %+v", h)
	}
	// A change makes another digest (another image).
	os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("c2\n"), 0o644)
	if other, _, _ := layerDigest(root); other == hexsum {
		t.Error("a changed tree kept its digest")
	}
}

func TestLayerLeavesOutSockets(t *testing.T) {
	root := tree(t)
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: filepath.Join(root, "sock")}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeLayer(root, &buf); err != nil {
		t.Fatal(err)
	}
	if _, ok := entries(t, buf.Bytes())["sock"]; ok {
		t.Error("a socket was written into the layer")
	}
}

func TestOciArchiveIsConsistent(t *testing.T) {
	root := tree(t)
	hexsum, size, err := layerDigest(root)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := ociArchive(&buf, root, hexsum, size); err != nil {
		t.Fatal(err)
	}
	blobs := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		blobs[h.Name] = data
	}
	check := func(d descriptor) []byte {
		data, ok := blobs["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		sum := sha256.Sum256(data)
		if !ok || "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || int64(len(data)) != d.Size {
			t.Fatalf("blob %s missing or not matching its descriptor", d.Digest)
		}
		return data
	}
	var index struct{ Manifests []descriptor }
	json.Unmarshal(blobs["index.json"], &index)
	if len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s", blobs["index.json"])
	}
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	json.Unmarshal(check(index.Manifests[0]), &manifest)
	var config struct {
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	json.Unmarshal(check(manifest.Config), &config)
	if len(manifest.Layers) != 1 || check(manifest.Layers[0]) == nil ||
		config.Rootfs.DiffIDs[0] != "sha256:"+hexsum {
		t.Fatalf("manifest %+v config %+v", manifest, config)
	}
	// A tree that changed between the digest and the upload is refused.
	os.WriteFile(filepath.Join(root, "etc", "new"), []byte("x"), 0o644)
	if err := ociArchive(io.Discard, root, hexsum, size); err == nil {
		t.Error("a tree grown since its digest was written as that layer")
	}
}

func TestImageNameFollowsAirlocksRule(t *testing.T) {
	n := imageName(strings.Repeat("ab", 32))
	if len(n) > 64 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
		t.Errorf("image name %q is not an airlock image name", n)
	}
}
