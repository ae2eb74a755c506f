package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link string
	flag       byte
	body       string
	mode       int64
}

func tarOf(t *testing.T, entries []entry) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.flag, Mode: e.mode, Size: int64(len(e.body)),
			Uid: os.Getuid(), Gid: os.Getgid()}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return &buf
}

func TestUnpackWritesTheTree(t *testing.T) {
	root := t.TempDir()
	err := unpack(tarOf(t, []entry{
		{name: "bin/", flag: tar.TypeDir, mode: 0o755},
		{name: "bin/tool", flag: tar.TypeReg, body: "#!tool", mode: 0o750},
		{name: "bin/alias", flag: tar.TypeSymlink, link: "tool", mode: 0o777},
		{name: "bin/hard", flag: tar.TypeLink, link: "bin/tool"},
		{name: "app-marker", flag: tar.TypeReg, body: "mine\n", mode: 0o644},
	}), root)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "bin/alias")); string(b) != "#!tool" {
		t.Fatalf("symlink reads %q", b)
	}
	fi, _ := os.Stat(filepath.Join(root, "bin/tool"))
	hard, _ := os.Stat(filepath.Join(root, "bin/hard"))
	if fi.Mode().Perm() != 0o750 || !os.SameFile(fi, hard) {
		t.Fatalf("mode %v, hard link the same file: %v", fi.Mode(), os.SameFile(fi, hard))
	}
	if b, _ := os.ReadFile(filepath.Join(root, "app-marker")); string(b) != "mine\n" {
		t.Fatalf("app-marker = %q", b)
	}
}

func TestUnpackNeverWritesOutsideRoot(t *testing.T) {
	outside := t.TempDir()
	for _, bad := range [][]entry{
		{{name: "../escape", flag: tar.TypeReg, body: "x", mode: 0o644}},
		{{name: "/abs", flag: tar.TypeReg, body: "x", mode: 0o644}},
		{{name: "out", flag: tar.TypeSymlink, link: outside}, {name: "out/x", flag: tar.TypeReg, body: "x"}},
		{{name: "h", flag: tar.TypeLink, link: "../../etc/passwd"}},
	} {
		root := t.TempDir()
		err := unpack(tarOf(t, bad), root)
		if err == nil || !strings.Contains(err.Error(), "tar entry") {
			t.Errorf("%+v: %v, want a refusal naming the entry", bad, err)
		}
	}
	if names, _ := os.ReadDir(outside); len(names) != 0 {
		t.Fatalf("written outside the root: %v", names)
	}
}
