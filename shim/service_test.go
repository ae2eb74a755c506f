package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/typeurl"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestShapeFromResourcesThenAnnotations(t *testing.T) {
	limit, quota, period := int64(768<<20), int64(150000), uint64(100000)
	spec := &specs.Spec{Linux: &specs.Linux{Resources: &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
	}}}
	sh, err := shapeOf(spec)
	if err != nil || sh.MemoryMB != 768 || sh.Cpus != 2 || sh.Network != nil {
		t.Fatalf("shapeOf(resources) = %+v, %v; want 768 MB, 2 cpus (1.5 rounded up)", sh, err)
	}
	spec.Annotations = map[string]string{"airlock.dev/memory_mb": "512", "airlock.dev/cpus": "1",
		"airlock.dev/disk_mb": "2048", "airlock.dev/network": "open"}
	sh, err = shapeOf(spec)
	if err != nil || sh.MemoryMB != 512 || sh.Cpus != 1 || sh.DiskMB != 2048 || sh.Network.Mode != "open" {
		t.Fatalf("shapeOf(annotations) = %+v, %v; the annotations win", sh, err)
	}
}

func TestShapeRefusesBadAnnotationsNamingThem(t *testing.T) {
	for key, v := range map[string]string{"airlock.dev/cpus": "many", "airlock.dev/memory_mb": "-1",
		"airlock.dev/disk_mb": "0", "airlock.dev/network": "allowlist"} {
		_, err := shapeOf(&specs.Spec{Annotations: map[string]string{key: v}})
		if !errdefs.IsInvalidArgument(errdefs.FromGRPC(err)) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%s: %v, want InvalidArgument naming the annotation", key, v, err)
		}
	}
}

func TestConfigSocketFromOptionsThenEnvThenDefault(t *testing.T) {
	t.Setenv("AIRLOCK_SOCKET", "")
	if cfg, err := loadConfig(nil); err != nil || cfg.Socket != defaultSocket {
		t.Fatalf("no options, no env: %+v %v", cfg, err)
	}
	t.Setenv("AIRLOCK_SOCKET", "/env/airlockd.sock")
	if cfg, _ := loadConfig(nil); cfg.Socket != "/env/airlockd.sock" {
		t.Fatalf("env: %+v", cfg)
	}
	dir := t.TempDir()
	write := func(body string) *runtimeoptions.Options {
		path := filepath.Join(dir, "shim.toml")
		os.WriteFile(path, []byte(body), 0o600)
		return &runtimeoptions.Options{ConfigPath: path}
	}
	any, _ := typeurl.MarshalAny(write(`socket = "/opt/airlockd.sock"`))
	if cfg, err := loadConfig(any); err != nil || cfg.Socket != "/opt/airlockd.sock" {
		t.Fatalf("config file: %+v %v (the option wins over the env)", cfg, err)
	}
	any, _ = typeurl.MarshalAny(write(`socket = "relative.sock"`))
	if _, err := loadConfig(any); !errdefs.IsInvalidArgument(errdefs.FromGRPC(err)) {
		t.Fatalf("a relative socket: %v, want InvalidArgument", err)
	}
	any, _ = typeurl.MarshalAny(&runtimeoptions.Options{ConfigPath: filepath.Join(dir, "missing.toml")})
	if _, err := loadConfig(any); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Fatalf("a missing config file: %v, want an error naming it", err)
	}
}

func TestEnvMapAndExitStatus(t *testing.T) {
	m := envMap([]string{"PATH=/bin", "A=1=2", "NOEQUALS", "A2=", "=x"})
	if len(m) != 3 || m["PATH"] != "/bin" || m["A"] != "1=2" || m["A2"] != "" {
		t.Fatalf("envMap = %v", m)
	}
	code, sig := 3, 15
	if s := (&execEvent{ExitCode: &code}).exitStatus(); s != 3 {
		t.Errorf("exit 3 -> %d", s)
	}
	if s := (&execEvent{Signal: &sig}).exitStatus(); s != 143 {
		t.Errorf("SIGTERM -> %d, want 143", s)
	}
}

func TestShapePortsGiveAnInterfaceWithoutEgress(t *testing.T) {
	sh, err := shapeOf(&specs.Spec{Annotations: map[string]string{annotationPorts: "8080, 9090"}})
	if err != nil || !reflect.DeepEqual(sh.Ports, []int{8080, 9090}) || sh.Network == nil ||
		sh.Network.Mode != "allowlist" {
		t.Fatalf("shapeOf(ports) = %+v, %v; want the ports and an allowlist of nothing", sh, err)
	}
	sh, err = shapeOf(&specs.Spec{Annotations: map[string]string{annotationPorts: "80", "airlock.dev/network": "open"}})
	if err != nil || sh.Network.Mode != "open" {
		t.Fatalf("ports with network open: %+v, %v", sh, err)
	}
	for _, bad := range []map[string]string{{annotationPorts: "0"}, {annotationPorts: "80,80"},
		{annotationPorts: "http"}, {annotationPorts: "70000"}, {annotationPorts: ""},
		{annotationPorts: "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"},
		{annotationPorts: "80", "airlock.dev/network": "none"}} {
		_, err := shapeOf(&specs.Spec{Annotations: bad})
		if !errdefs.IsInvalidArgument(errdefs.FromGRPC(err)) || !strings.Contains(err.Error(), annotationPorts) {
			t.Errorf("%v: %v, want InvalidArgument naming %s", bad, err, annotationPorts)
		}
	}
}

func TestNetnsPathIsTheSpecsNetworkNamespace(t *testing.T) {
	spec := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace},
		{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}}}
	if p := netnsPath(spec); p != "/var/run/netns/cni-1" {
		t.Fatalf("netnsPath = %q", p)
	}
	if p := netnsPath(&specs.Spec{}); p != "" {
		t.Fatalf("no linux section: %q, want the shim's own", p)
	}
}
