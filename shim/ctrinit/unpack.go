package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// unpack writes the tar's entries under root. Names must be relative and
// clean; no entry is written through a symlink (every parent is checked
// to be a real directory below root), and an existing name is replaced.
func unpack(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if name == "" || name == "." {
			continue
		}
		if filepath.IsAbs(name) || filepath.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("tar entry %q: not a clean relative path", hdr.Name)
		}
		if err := realParents(root, name); err != nil {
			return err
		}
		path := filepath.Join(root, name)
		mode := os.FileMode(hdr.Mode & 0o7777)
		if hdr.Typeflag != tar.TypeDir {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(path); err == nil && !fi.IsDir() {
				os.Remove(path)
			}
			if err := os.Mkdir(path, 0o700); err != nil && !os.IsExist(err) {
				return err
			}
			dirs = append(dirs, dirTime{path, hdr.ModTime})
		case tar.TypeReg:
			fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return &os.PathError{Op: "create", Path: path, Err: err}
			}
			f := os.NewFile(uintptr(fd), path)
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, path); err != nil {
				return err
			}
		case tar.TypeLink:
			target := filepath.Clean(hdr.Linkname)
			if filepath.IsAbs(target) || target == ".." || strings.HasPrefix(target, "../") {
				return fmt.Errorf("tar entry %q: hard link to %q", hdr.Name, hdr.Linkname)
			}
			if err := realParents(root, target); err != nil {
				return err
			}
			if err := unix.Linkat(unix.AT_FDCWD, filepath.Join(root, target), unix.AT_FDCWD, path, 0); err != nil {
				return &os.LinkError{Op: "link", Old: target, New: path, Err: err}
			}
			continue
		case tar.TypeFifo:
			if err := unix.Mkfifo(path, uint32(mode)); err != nil {
				return err
			}
		default:
			continue // devices and the like: the guest's /dev is bound in
		}
		if err := os.Lchown(path, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeSymlink {
			if err := os.Chmod(path, mode); err != nil {
				return err
			}
		}
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	// Directories last: their modes may forbid the writes above, their
	// mtimes change with every entry made in them.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		ts := []unix.Timespec{unix.NsecToTimespec(d.t.UnixNano()), unix.NsecToTimespec(d.t.UnixNano())}
		unix.UtimesNanoAt(unix.AT_FDCWD, d.path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// realParents checks that every parent of name below root is a directory
// (not a symlink), so nothing is written outside root.
func realParents(root, name string) error {
	dir := root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, p)
		fi, err := os.Lstat(dir)
		if err != nil {
			return fmt.Errorf("tar entry %q: parent %s: %v", name, dir, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("tar entry %q: parent %s is not a directory", name, dir)
		}
	}
	return nil
}
