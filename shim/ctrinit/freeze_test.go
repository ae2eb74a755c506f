package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestFreezeRefusesABadStateOrPid(t *testing.T) {
	if err := freeze("2", []string{"123"}); err == nil || !strings.Contains(err.Error(), `"2"`) {
		t.Errorf("state 2: %v, want an error naming it", err)
	}
	// PID 1 is the guest agent: never frozen, whatever its cgroup.
	for _, pid := range []string{"1", "0", "-3", "x"} {
		if _, err := cgroupOf("/sys/fs/cgroup", pid); err == nil || !strings.Contains(err.Error(), "pid") {
			t.Errorf("pid %s: %v, want it refused", pid, err)
		}
	}
	if _, err := cgroupOf("/sys/fs/cgroup", "999999999"); err == nil {
		t.Errorf("a pid that does not exist was accepted")
	}
}

func TestFreezeRefusesACgroupItSharesWithItself(t *testing.T) {
	root, err := cgroup2Root()
	if err != nil {
		t.Skip("no cgroup v2 here: ", err)
	}
	_, err = cgroupOf(root, strconv.Itoa(os.Getpid()))
	if err == nil {
		t.Fatal("the caller's own cgroup was accepted: freezing it would freeze the freezer")
	}
}
