package main

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func limitedSpec(limit int64, terminal bool) *specs.Spec {
	return &specs.Spec{Process: &specs.Process{Terminal: terminal},
		Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
}

func TestMemoryLimitBecomesTheExecLimitInWholeMiB(t *testing.T) {
	for limit, want := range map[int64]int64{32 << 20: 32, 32<<20 + 1000: 32, 1 << 20: 1, 256 << 20: 256} {
		l, err := memoryLimit(limitedSpec(limit, false), 256)
		if err != nil || l == nil || l.MemoryMB != want {
			t.Errorf("memoryLimit(%d bytes) = %+v, %v; want %d MiB", limit, l, err, want)
		}
	}
	for _, spec := range []*specs.Spec{{}, {Linux: &specs.Linux{}}, limitedSpec(0, true), limitedSpec(-1, false)} {
		if l, err := memoryLimit(spec, 256); l != nil || err != nil {
			t.Errorf("no limit in %+v: got %+v, %v", spec, l, err)
		}
	}
}

// A terminal's process takes the limit too: airlockd's PTY start carries
// the exec limits.
func TestATerminalContainerGetsItsLimit(t *testing.T) {
	if l, err := memoryLimit(limitedSpec(64<<20, true), 256); err != nil || l == nil || l.MemoryMB != 64 {
		t.Errorf("terminal: %+v, %v; want 64 MiB", l, err)
	}
}

func TestMemoryLimitAirlockCannotHonourIsRefusedNamingTheField(t *testing.T) {
	for what, spec := range map[string]*specs.Spec{
		"minimum":  limitedSpec(512<<10, false),
		"pod's VM": limitedSpec(257<<20, false),
	} {
		_, err := memoryLimit(spec, 256)
		if !errdefs.IsInvalidArgument(errdefs.FromGRPC(err)) || !strings.Contains(err.Error(), "memory_limit_in_bytes") ||
			!strings.Contains(err.Error(), what) {
			t.Errorf("%s: %v, want InvalidArgument naming the field and %q", what, err, what)
		}
	}
}
