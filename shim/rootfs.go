package main

// Turns the container's root filesystem (containerd's mounted rootfs in the
// bundle) into an airlock image through airlockd's OCI import: one
// uncompressed layer written deterministically from the tree, wrapped in an
// OCI image layout tar. The layer's sha256 names the image, so the same
// root filesystem is imported once and later containers boot the cached
// image.

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/containerd/errdefs"
	"golang.org/x/sys/unix"
)

const (
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
)

// writeLayer writes the tree under root as a tar to w: entries in lexical
// order, owners and modes and mtimes as on disk, hard links kept; sockets
// and device nodes are left out (airlock's import drops device nodes too).
// The same tree always gives the same bytes. It opens every file with
// O_NOFOLLOW below directories it walked, never through a symlink.
func writeLayer(root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		if mode&(fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice|fs.ModeIrregular) != 0 {
			return nil
		}
		target := ""
		if mode&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = hdr.ModTime, hdr.ModTime
		hdr.Format = tar.FormatPAX
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st != nil {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if mode.IsRegular() && st.Nlink > 1 {
				key := [2]uint64{uint64(st.Dev), st.Ino}
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
					return tw.WriteHeader(hdr)
				}
				links[key] = hdr.Name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !mode.IsRegular() {
			return nil
		}
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &fs.PathError{Op: "open", Path: path, Err: err}
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		n, err := io.Copy(tw, f)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s changed while it was read", path)
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// layerDigest is the hex sha256 and the size of writeLayer(root).
func layerDigest(root string) (string, int64, error) {
	h := sha256.New()
	var c countWriter
	if err := writeLayer(root, io.MultiWriter(h, &c)); err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), c.n, nil
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

func describe(media string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: media, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

// ociArchive writes an OCI image layout tar of one layer: the layer of
// root, which must hash to layerHex and be layerSize bytes long (the tar
// writer refuses a tree that changed since).
func ociArchive(w io.Writer, root, layerHex string, layerSize int64) error {
	layer := descriptor{MediaType: mediaLayer, Digest: "sha256:" + layerHex, Size: layerSize}
	config, _ := json.Marshal(map[string]interface{}{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]interface{}{},
		"rootfs":       map[string]interface{}{"type": "layers", "diff_ids": []string{layer.Digest}},
	})
	configDesc := describe(mediaConfig, config)
	manifest, _ := json.Marshal(map[string]interface{}{
		"schemaVersion": 2, "mediaType": mediaManifest, "config": configDesc, "layers": []descriptor{layer},
	})
	manifestDesc := describe(mediaManifest, manifest)
	index, _ := json.Marshal(map[string]interface{}{"schemaVersion": 2, "manifests": []descriptor{manifestDesc}})

	tw := tar.NewWriter(w)
	put := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)),
			Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	if err := put("blobs/sha256/"+manifestDesc.Digest[7:], manifest); err != nil {
		return err
	}
	if err := put("blobs/sha256/"+configDesc.Digest[7:], config); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/" + layerHex, Mode: 0o644, Size: layerSize,
		Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if err := writeLayer(root, tw); err != nil {
		return err
	}
	return tw.Close()
}

// imageName is the airlock image of a layer digest (airlock's image names:
// 1 to 64 of a-z 0-9 _ -).
func imageName(layerHex string) string { return "ctr-" + layerHex[:32] }

// ensureImage imports root as an airlock image unless one of the same
// content is there already; it returns the image.
func (a *airlock) ensureImage(ctx context.Context, root string) (*image, error) {
	hexsum, size, err := layerDigest(root)
	if err != nil {
		return nil, fmt.Errorf("reading the container's rootfs: %w", err)
	}
	name := imageName(hexsum)
	var img image
	path := "/v1/images/" + url.PathEscape(name)
	if err := a.call(ctx, "GET", path, nil, &img); err == nil {
		return &img, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(ociArchive(pw, root, hexsum, size)) }()
	resp, err := a.do(ctx, "POST", path+"/import", pr, "application/x-tar")
	pr.Close()
	if err != nil {
		// Another container of the same rootfs imported it meanwhile.
		if errors.Is(err, errdefs.ErrFailedPrecondition) && a.call(ctx, "GET", path, nil, &img) == nil {
			return &img, nil
		}
		return nil, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&img); err != nil {
		return nil, err
	}
	return &img, nil
}
