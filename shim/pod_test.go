package main

import (
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestAPodsContainersShareTheSandboxContainersShim(t *testing.T) {
	pod := map[string]string{annotationContainerType: containerTypeSandbox, annotationSandboxID: "pod1"}
	app := map[string]string{annotationContainerType: containerTypeContainer, annotationSandboxID: "pod1"}
	if g := shimGroup("pod1", pod); g != "pod1" {
		t.Errorf("sandbox container: group %q", g)
	}
	if g := shimGroup("app1", app); g != "pod1" {
		t.Errorf("app container: group %q, want its pod's", g)
	}
	if g := shimGroup("plain", nil); g != "plain" {
		t.Errorf("no pod (ctr run): group %q, want its own id", g)
	}
	if kind, id := podRole(app); kind != containerTypeContainer || id != "pod1" {
		t.Errorf("podRole = %q %q", kind, id)
	}
}

func TestInPodRunsTheProcessChrootedAsItsUser(t *testing.T) {
	p := &specs.Process{Args: []string{"sh", "-c", "id"}, Cwd: "/work", Env: []string{"A=1"},
		User: specs.User{UID: 1000, GID: 100, AdditionalGids: []uint32{5, 6}}}
	q := inPod("/.airlock-ctr/c1", p)
	want := []string{guestCtrInit, "run", "-root", "/.airlock-ctr/c1/rootfs", "-cwd", "/work", "-uid", "1000",
		"-gid", "100", "-groups", "5,6", "--", "sh", "-c", "id"}
	if !reflect.DeepEqual(q.Args, want) {
		t.Fatalf("args %q\nwant %q", q.Args, want)
	}
	if q.Cwd != "/" || q.User.UID != 0 || q.User.GID != 0 || !reflect.DeepEqual(q.Env, p.Env) {
		t.Fatalf("in the VM: cwd %q user %+v env %v; want / as root, the env kept", q.Cwd, q.User, q.Env)
	}
	if p.Args[0] != "sh" || p.Cwd != "/work" || p.User.UID != 1000 {
		t.Fatalf("the spec itself was changed: %+v", p)
	}
	if q := inPod("/d", &specs.Process{Args: []string{"true"}}); q.Args[5] != "/" {
		t.Fatalf("no cwd: %q, want /", q.Args)
	}
}
