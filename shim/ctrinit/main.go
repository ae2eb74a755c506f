// airlock-ctr-init runs inside a pod's microVM, where the shim uploads it
// (a static binary: the pod's image need not have a libc, a shell or tar).
// It gives an app container of the pod its own root filesystem there:
//
//	airlock-ctr-init unpack TAR DIR   the container's rootfs (the shim's
//	                                  layer tar) into DIR/rootfs, with /proc,
//	                                  /sys and the guest's /dev mounted in it
//	airlock-ctr-init run -root R -cwd C -uid U -gid G [-groups a,b] -- ARGV...
//	                                  chroot R, chdir C, drop to U:G, exec ARGV
//	airlock-ctr-init remove DIR       unmounts and removes what unpack made
//	airlock-ctr-init freeze 1|0 PID...
//	                                  freezes (1) or thaws (0) the cgroup v2
//	                                  of each PID (the shim's Pause/Resume)
//
// Errors go to stderr and exit status 127 (run) or 1, as a shell's would.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fail(1, "usage: airlock-ctr-init unpack TAR DIR | run ... -- ARGV | remove DIR | freeze 1|0 PID...")
	}
	var err error
	switch os.Args[1] {
	case "unpack":
		if len(os.Args) != 4 {
			fail(1, "usage: airlock-ctr-init unpack TAR DIR")
		}
		err = unpackRootfs(os.Args[2], os.Args[3])
	case "run":
		err = run(os.Args[2:])
		if err != nil {
			fail(127, err.Error())
		}
	case "freeze":
		if len(os.Args) < 4 {
			fail(1, "usage: airlock-ctr-init freeze 1|0 PID...")
		}
		err = freeze(os.Args[2], os.Args[3:])
	case "remove":
		if len(os.Args) != 3 {
			fail(1, "usage: airlock-ctr-init remove DIR")
		}
		err = remove(os.Args[2])
	default:
		fail(1, "unknown command "+os.Args[1])
	}
	if err != nil {
		fail(1, err.Error())
	}
}

func fail(code int, msg string) {
	fmt.Fprintln(os.Stderr, "airlock-ctr-init: "+msg)
	os.Exit(code)
}

// The mounts a container's processes expect, in mount order.
var mounts = []struct{ dir, fstype, source string }{
	{"proc", "proc", "proc"},
	{"sys", "sysfs", "sysfs"},
	{"dev", "", "/dev"}, // the guest's devtmpfs, bound recursively (pts, shm)
}

func unpackRootfs(tarPath, dir string) error {
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	err = unpack(f, root)
	f.Close()
	if err != nil {
		return err
	}
	os.Remove(tarPath)
	for _, m := range mounts {
		target := filepath.Join(root, m.dir)
		if fi, err := os.Lstat(target); err != nil || !fi.IsDir() {
			os.Remove(target)
			if err := os.Mkdir(target, 0o755); err != nil {
				return err
			}
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if m.fstype == "" {
			flags = unix.MS_BIND | unix.MS_REC
		}
		if err := unix.Mount(m.source, target, m.fstype, flags, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %v", m.source, target, err)
		}
	}
	return nil
}

func remove(dir string) error {
	root := filepath.Join(dir, "rootfs")
	for i := len(mounts) - 1; i >= 0; i-- {
		target := filepath.Join(root, mounts[i].dir)
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %v", target, err)
		}
	}
	return os.RemoveAll(dir)
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	root := fs.String("root", "", "the container's root filesystem")
	cwd := fs.String("cwd", "/", "working directory inside it")
	uid := fs.Uint("uid", 0, "user id")
	gid := fs.Uint("gid", 0, "group id")
	groups := fs.String("groups", "", "additional group ids, comma separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if *root == "" || len(argv) == 0 {
		return fmt.Errorf("run: -root and a command are required")
	}
	var gids []int
	for _, g := range strings.Split(*groups, ",") {
		if g == "" {
			continue
		}
		n, err := strconv.Atoi(g)
		if err != nil {
			return fmt.Errorf("run: group %q: %v", g, err)
		}
		gids = append(gids, n)
	}
	if err := syscall.Chroot(*root); err != nil {
		return fmt.Errorf("chroot %s: %v", *root, err)
	}
	if err := os.Chdir(*cwd); err != nil {
		return fmt.Errorf("cwd %s: %v", *cwd, err)
	}
	if err := syscall.Setgroups(gids); err != nil {
		return fmt.Errorf("setgroups: %v", err)
	}
	if err := syscall.Setgid(int(*gid)); err != nil {
		return fmt.Errorf("setgid %d: %v", *gid, err)
	}
	if err := syscall.Setuid(int(*uid)); err != nil {
		return fmt.Errorf("setuid %d: %v", *uid, err)
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		// The container's PATH (its environment) inside its own root.
		p, err := exec.LookPath(path)
		if err != nil {
			return fmt.Errorf("%s: not found in the container's PATH", path)
		}
		path = p
	}
	return syscall.Exec(path, argv, os.Environ())
}
