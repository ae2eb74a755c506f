package main

// An app container's memory limit (CRI's memory_limit_in_bytes, the OCI
// spec's linux.resources.memory.limit) in its pod's VM: airlockd's exec
// limit memory_mb, which the guest agent makes the memory.max of the
// exec's own cgroup. Each of the container's processes (its init and each
// exec into it) gets that limit for its own tree: under runc they share
// the container's one cgroup, here each has its own.

import (
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const limitField = "linux.resources.memory.limit (CRI memory_limit_in_bytes)"

// memoryLimit is the container's limit as airlock's exec limits (nil: no
// limit), or an InvalidArgument error naming the field when airlock cannot
// honour it: below the guest agent's minimum of 1 MiB, more than the pod's
// VM has (vmMB). A terminal process gets it too (airlockd's PTY start
// takes the exec limits).
func memoryLimit(spec *specs.Spec, vmMB int) (*execLimits, error) {
	if spec.Linux == nil || spec.Linux.Resources == nil || spec.Linux.Resources.Memory == nil ||
		spec.Linux.Resources.Memory.Limit == nil || *spec.Linux.Resources.Memory.Limit <= 0 {
		return nil, nil
	}
	limit := *spec.Linux.Resources.Memory.Limit
	// Whole MiB, rounded down: the process never gets more than it was given.
	mb := limit >> 20
	if mb < 1 {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument,
			"%s: %d bytes is below airlock's minimum of 1 MiB for a container's processes", limitField, limit)
	}
	if vmMB > 0 && mb > int64(vmMB) {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument,
			"%s: %d MiB is more than the pod's VM has (%d MiB; give the pod more with the annotation "+
				"airlock.dev/memory_mb)", limitField, mb, vmMB)
	}
	return &execLimits{MemoryMB: mb}, nil
}
