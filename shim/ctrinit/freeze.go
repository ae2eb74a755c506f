package main

// freeze: cgroup v2's freezer on the cgroups of a container's processes.
// The guest agent runs each exec in a cgroup of its own, so freezing the
// cgroup of each of the container's processes stops exactly that
// container's trees: the streaming execs and their stdio stay open (their
// processes just do not run), unlike airlock's VM pause, which ends them.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const freezeWait = 10 * time.Second

// freeze writes state ("1" frozen, "0" thawed) to the cgroup.freeze of
// each pid's cgroup and waits until the kernel reports every one done.
func freeze(state string, pids []string) error {
	if state != "0" && state != "1" {
		return fmt.Errorf("freeze: state %q is not 1 (freeze) or 0 (thaw)", state)
	}
	root, err := cgroup2Root()
	if err != nil {
		return err
	}
	var dirs []string
	for _, pid := range pids {
		dir, err := cgroupOf(root, pid)
		if err != nil {
			return err
		}
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(state), 0); err != nil {
			return fmt.Errorf("freeze: %v", err)
		}
	}
	deadline := time.Now().Add(freezeWait)
	for _, dir := range dirs {
		for !hasKey(filepath.Join(dir, "cgroup.events"), "frozen "+state) {
			if time.Now().After(deadline) {
				return fmt.Errorf("freeze: %s did not reach frozen %s in %v", dir, state, freezeWait)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// cgroupOf is the cgroup v2 directory of pid, which must hold neither PID
// 1 (the guest agent: freezing it would stop the VM's every exec) nor this
// process.
func cgroupOf(root, pid string) (string, error) {
	if n, err := strconv.Atoi(pid); err != nil || n <= 1 {
		return "", fmt.Errorf("freeze: %q is not a container's pid", pid)
	}
	data, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("freeze: process %s: %v", pid, err)
	}
	var rel string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(line, "0::") {
			rel = strings.TrimPrefix(line, "0::")
		}
	}
	if rel == "" || rel == "/" {
		return "", fmt.Errorf("freeze: process %s has no cgroup of its own", pid)
	}
	dir := filepath.Join(root, filepath.Clean(rel))
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return "", fmt.Errorf("freeze: %v", err)
	}
	self := strconv.Itoa(os.Getpid())
	for _, p := range strings.Fields(string(procs)) {
		if p == "1" || p == self {
			return "", fmt.Errorf("freeze: the cgroup %s of process %s is shared with the guest agent", rel, pid)
		}
	}
	return dir, nil
}

// cgroup2Root is where the guest mounted cgroup v2.
func cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ... <mount point> ... - <fstype> <source> <options>
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	return "", fmt.Errorf("freeze: cgroup v2 is not mounted in the guest")
}

func hasKey(path, line string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		if l == line {
			return true
		}
	}
	return false
}
