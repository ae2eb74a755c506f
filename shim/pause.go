package main

// Pause/Resume: the cgroup v2 freezer on the container's processes in the
// guest (airlock-ctr-init freeze), not airlock's VM pause, which saves the
// VM but first ends its streaming execs and so the container's processes.
// The guest agent runs each exec in a cgroup of its own: the container's
// init and its execs are frozen and thawed one cgroup each.

import (
	"context"
	"strconv"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	taskAPI "github.com/containerd/containerd/runtime/v2/task"
	ptypes "github.com/gogo/protobuf/types"
)

// processesIn is the container's processes in state `want` (init first).
func (s *service) processesIn(c *container, want task.Status) []*process {
	var out []*process
	if st, _, _, _ := c.init.state(); st == want {
		out = append(out, c.init)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range c.execs {
		if st, _, _, _ := e.state(); st == want {
			out = append(out, e)
		}
	}
	return out
}

// freezer is the container (its own sandbox's, or its pod's sandbox
// container) that uploads airlock-ctr-init into the VM.
func (s *service) freezer(c *container) (*container, error) {
	if c.guestDir == "" {
		return c, nil
	}
	for _, o := range s.all() {
		if o.guestDir == "" && o.sandbox == c.sandbox {
			return o, nil
		}
	}
	return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: its pod's sandbox container is gone", c.id)
}

func (s *service) all() []*container {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*container
	for _, c := range s.containers {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// setFrozen freezes (or thaws) the processes' cgroups and records their state.
func (s *service) setFrozen(ctx context.Context, c *container, procs []*process, frozen bool) error {
	owner, err := s.freezer(c)
	if err != nil {
		return err
	}
	if err := owner.ensureCtrInit(ctx); err != nil {
		return err
	}
	state, from, to := "0", task.StatusPaused, task.StatusRunning
	if frozen {
		state, from, to = "1", task.StatusRunning, task.StatusPaused
	}
	argv := []string{guestCtrInit, "freeze", state}
	for _, p := range procs {
		_, pid, _, _ := p.state()
		if pid == 0 {
			return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition,
				"container %s: a process has no guest pid yet to pause by", c.id)
		}
		argv = append(argv, strconv.FormatUint(uint64(pid), 10))
	}
	if err := c.client.runSync(ctx, c.sandbox, argv); err != nil {
		return errdefs.ToGRPC(err)
	}
	for _, p := range procs {
		p.mu.Lock()
		if p.status == from {
			p.status = to
		}
		p.mu.Unlock()
	}
	return nil
}

func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := c.init.state(); st != task.StatusRunning {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s is not running (%s)", r.ID, st)
	}
	if err := s.setFrozen(ctx, c, s.processesIn(c, task.StatusRunning), true); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskPaused{ContainerID: c.id})
	return empty, nil
}

func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := c.init.state(); st != task.StatusPaused {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s is not paused (%s)", r.ID, st)
	}
	if err := s.setFrozen(ctx, c, s.processesIn(c, task.StatusPaused), false); err != nil {
		return nil, err
	}
	s.send(&eventstypes.TaskResumed{ContainerID: c.id})
	return empty, nil
}
