package main

// The containerd.task.v2.Task service of the shim: a container of its own,
// or a pod's containers (one shim per pod), in one airlock sandbox (microVM)
// each; the processes are airlock execs.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	v2stats "github.com/containerd/cgroups/v2/stats"
	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/log"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/runtime"
	"github.com/containerd/containerd/runtime/v2/shim"
	taskAPI "github.com/containerd/containerd/runtime/v2/task"
	"github.com/containerd/typeurl"
	ptypes "github.com/gogo/protobuf/types"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var empty = &ptypes.Empty{}

// Sandbox life: airlock's maximum; the container ends it by Delete.
const sandboxTimeout = 604800

type container struct {
	id      string
	bundle  string
	sandbox string
	client  *airlock
	rootfs  string // mounted by Create, unmounted by Delete
	init    *process
	execs   map[string]*process

	guestDir string      // an app container of a pod: its copy in the pod's VM ("": the sandbox is its own)
	memoryMB int         // the sandbox's VM memory (a pod's sandbox container)
	limits   *execLimits // an app container's memory limit, for each of its processes
	ports    forwards    // airlock.dev/ports: the pod IP's ports relayed to the guest
	initMu   sync.Mutex
	initUp   bool // a pod's sandbox container: airlock-ctr-init is in its VM
}

type service struct {
	ctx      context.Context
	shutdown shutdown.Service
	events   chan interface{}

	mu         sync.Mutex
	closed     bool // events is closed (shutdown): later events are dropped
	containers map[string]*container
}

func newService(ctx context.Context, publisher shim.Publisher, sd shutdown.Service) *service {
	s := &service{ctx: ctx, shutdown: sd, events: make(chan interface{}, 128),
		containers: map[string]*container{}}
	go s.forward(ctx, publisher)
	// The shim's main waits for the publisher to be closed before it exits.
	sd.RegisterCallback(func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.closed {
			s.closed = true
			close(s.events)
		}
		return nil
	})
	if address, err := shim.ReadAddress("address"); err == nil {
		sd.RegisterCallback(func(context.Context) error { return shim.RemoveSocket(address) })
	}
	return s
}

// forward publishes events one at a time, in the order they were sent.
func (s *service) forward(ctx context.Context, publisher shim.Publisher) {
	ns, _ := namespaces.Namespace(ctx)
	ctx = namespaces.WithNamespace(context.Background(), ns)
	for e := range s.events {
		if err := publisher.Publish(ctx, topic(e), e); err != nil {
			log.G(ctx).WithError(err).Error("post event")
		}
	}
	publisher.Close()
}

func topic(e interface{}) string {
	switch e.(type) {
	case *eventstypes.TaskCreate:
		return runtime.TaskCreateEventTopic
	case *eventstypes.TaskStart:
		return runtime.TaskStartEventTopic
	case *eventstypes.TaskExit:
		return runtime.TaskExitEventTopic
	case *eventstypes.TaskDelete:
		return runtime.TaskDeleteEventTopic
	case *eventstypes.TaskExecAdded:
		return runtime.TaskExecAddedEventTopic
	case *eventstypes.TaskExecStarted:
		return runtime.TaskExecStartedEventTopic
	case *eventstypes.TaskPaused:
		return runtime.TaskPausedEventTopic
	case *eventstypes.TaskResumed:
		return runtime.TaskResumedEventTopic
	case *eventstypes.TaskOOM:
		return runtime.TaskOOMEventTopic
	}
	return runtime.TaskUnknownTopic
}

func (s *service) send(e interface{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.events <- e
	}
}

func (s *service) get(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.containers[id]
	if c == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "container %s not created", id)
	}
	return c, nil
}

func (s *service) process(id, execID string) (*container, *process, error) {
	c, err := s.get(id)
	if err != nil {
		return nil, nil, err
	}
	if execID == "" {
		return c, c.init, nil
	}
	s.mu.Lock()
	p := c.execs[execID]
	s.mu.Unlock()
	if p == nil {
		return nil, nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "exec %s of %s not found", execID, id)
	}
	return c, p, nil
}

func readSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "config.json: %v", err)
	}
	if spec.Process == nil || len(spec.Process.Args) == 0 {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "config.json: no process args")
	}
	return &spec, nil
}

// Create mounts the rootfs and, for a container of its own or a pod's
// sandbox container, imports it as an airlock image (once per content)
// and boots the container's sandbox; an app container of a pod gets a copy
// of its rootfs in the pod's VM instead (createInPod). The process runs at Start.
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	s.mu.Lock()
	if _, ok := s.containers[r.ID]; ok {
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "container %s already created", r.ID)
	}
	s.containers[r.ID] = nil // reserved while it is made
	s.mu.Unlock()
	defer func() {
		if retErr != nil {
			s.mu.Lock()
			delete(s.containers, r.ID)
			s.mu.Unlock()
		}
	}()
	if r.Checkpoint != "" {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint restore is not supported by airlock")
	}
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(r.Options)
	if err != nil {
		return nil, err
	}
	kind, podID := podRole(spec.Annotations)
	var shape *sandboxSpec
	if kind != containerTypeContainer {
		if shape, err = shapeOf(spec); err != nil {
			return nil, err
		}
	}
	rootfs, unmount, err := mountRootfs(r)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			unmount()
		}
	}()
	var c *container
	if kind == containerTypeContainer {
		c, err = s.createInPod(ctx, r, spec, cfg, podID, rootfs)
	} else {
		c, err = s.createVM(ctx, r, spec, cfg, shape, rootfs)
	}
	if err != nil {
		return nil, err
	}
	if len(r.Rootfs) > 0 {
		c.rootfs = rootfs
	}
	s.mu.Lock()
	s.containers[r.ID] = c
	s.mu.Unlock()
	s.send(&eventstypes.TaskCreate{ContainerID: r.ID, Bundle: r.Bundle, Rootfs: r.Rootfs,
		IO:         &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Checkpoint: r.Checkpoint})
	return &taskAPI.CreateTaskResponse{}, nil
}

// mountRootfs mounts the request's rootfs on the bundle's rootfs dir (none
// given: the bundle's rootfs is used as it is); unmount undoes it.
func mountRootfs(r *taskAPI.CreateTaskRequest) (string, func(), error) {
	rootfs := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) == 0 {
		return rootfs, func() {}, nil
	}
	var mounts []mount.Mount
	for _, m := range r.Rootfs {
		mounts = append(mounts, mount.Mount{Type: m.Type, Source: m.Source, Options: m.Options})
	}
	if err := os.MkdirAll(rootfs, 0o711); err != nil {
		return "", nil, err
	}
	if err := mount.All(mounts, rootfs); err != nil {
		return "", nil, errdefs.ToGRPCf(errdefs.ErrUnknown, "mounting rootfs: %v", err)
	}
	return rootfs, func() { mount.UnmountAll(rootfs, 0) }, nil
}

// createVM boots the container's own sandbox from its rootfs.
func (s *service) createVM(ctx context.Context, r *taskAPI.CreateTaskRequest, spec *specs.Spec, cfg *config,
	shape *sandboxSpec, rootfs string) (_ *container, retErr error) {
	client := newAirlock(cfg.Socket)
	t0 := time.Now()
	img, err := client.ensureImage(ctx, rootfs)
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	t1 := time.Now()
	ns, _ := namespaces.Namespace(ctx)
	shape.Image = img.Name
	shape.Timeout = sandboxTimeout
	shape.Metadata = map[string]string{"containerd.id": r.ID, "containerd.namespace": ns}
	if min := int(img.RootfsBytes>>20) + 256; shape.DiskMB < min {
		shape.DiskMB = min
	}
	var sb sandbox
	if err := client.call(ctx, "POST", "/v1/sandboxes", shape, &sb); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	defer func() {
		if retErr != nil {
			client.call(context.Background(), "DELETE", "/v1/sandboxes/"+sb.ID+"?wait=true", nil, nil)
		}
	}()
	// What `delete` needs to clean up after a shim that died.
	if err := writeRecord(r.Bundle, record{Sandbox: sb.ID, Socket: cfg.Socket}); err != nil {
		return nil, err
	}
	c := &container{id: r.ID, bundle: r.Bundle, sandbox: sb.ID, client: client, execs: map[string]*process{},
		init: newProcess("", spec.Process, r.Stdin, r.Stdout, r.Stderr, r.Terminal), memoryMB: sb.MemoryMB}
	if err := c.ports.start(ctx, client, sb.ID, netnsPath(spec), shape.Ports); err != nil {
		c.ports.close()
		return nil, err
	}
	log.G(ctx).Infof("container %s runs in airlock sandbox %s (image %s: %d ms, sandbox %d ms)", r.ID, sb.ID,
		img.Name, t1.Sub(t0).Milliseconds(), time.Since(t1).Milliseconds())
	return c, nil
}

// shapeOf reads cpus and memory from the spec's resources, then the
// airlock.dev/ annotations (which win); airlockd checks the ranges and
// names the field it refuses.
func shapeOf(spec *specs.Spec) (*sandboxSpec, error) {
	sh := &sandboxSpec{}
	if spec.Linux != nil && spec.Linux.Resources != nil {
		res := spec.Linux.Resources
		if res.Memory != nil && res.Memory.Limit != nil && *res.Memory.Limit > 0 {
			sh.MemoryMB = int(*res.Memory.Limit >> 20)
		}
		if res.CPU != nil && res.CPU.Quota != nil && res.CPU.Period != nil && *res.CPU.Quota > 0 &&
			*res.CPU.Period > 0 {
			sh.Cpus = int(math.Ceil(float64(*res.CPU.Quota) / float64(*res.CPU.Period)))
		}
	}
	for key, field := range map[string]*int{"airlock.dev/memory_mb": &sh.MemoryMB, "airlock.dev/cpus": &sh.Cpus,
		"airlock.dev/disk_mb": &sh.DiskMB} {
		v, ok := spec.Annotations[key]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "annotation %s: %q is not a positive integer",
				key, v)
		}
		*field = n
	}
	if mode, ok := spec.Annotations["airlock.dev/network"]; ok {
		if mode != "none" && mode != "open" {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "annotation airlock.dev/network: %q is not none or open",
				mode)
		}
		sh.Network = &networkPolicy{Mode: mode}
	}
	if v, ok := spec.Annotations[annotationPorts]; ok {
		ports, err := parsePorts(v)
		if err != nil {
			return nil, err
		}
		if sh.Network != nil && sh.Network.Mode == "none" {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument,
				"annotation %s needs a network: airlock.dev/network none gives the VM no interface", annotationPorts)
		}
		if sh.Network == nil {
			// An interface for the inbound forwards, no egress.
			sh.Network = &networkPolicy{Mode: "allowlist"}
		}
		sh.Ports = ports
	}
	return sh, nil
}

func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := p.state(); st != task.StatusCreated {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s already started", r.ID+r.ExecID)
	}
	if err := p.start(ctx, c.client, c.sandbox, func(p *process) { s.exited(c, p) }); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	_, pid, _, _ := p.state()
	if r.ExecID == "" {
		s.send(&eventstypes.TaskStart{ContainerID: c.id, Pid: pid})
	} else {
		s.send(&eventstypes.TaskExecStarted{ContainerID: c.id, ExecID: r.ExecID, Pid: pid})
	}
	close(p.started)
	return &taskAPI.StartResponse{Pid: pid}, nil
}

// exited publishes a process's exit; the init's end kills the container's
// other processes, as the end of a PID namespace's init does.
func (s *service) exited(c *container, p *process) {
	_, pid, status, at := p.state()
	id := c.id
	if p.id != "" {
		id = p.id
	}
	p.mu.Lock()
	oom := p.oomKilled
	p.mu.Unlock()
	if oom {
		// Before the exit, as runc's shim reports it: the CRI then gives
		// the container the reason OOMKilled.
		s.send(&eventstypes.TaskOOM{ContainerID: c.id})
	}
	s.send(&eventstypes.TaskExit{ContainerID: c.id, ID: id, Pid: pid, ExitStatus: status, ExitedAt: at})
	if p.id != "" {
		return
	}
	s.mu.Lock()
	var others []*process
	for _, e := range c.execs {
		others = append(others, e)
	}
	s.mu.Unlock()
	for _, e := range others {
		e.kill(s.ctx, c.client, c.sandbox, 9)
	}
}

func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, pid, status, at := p.state()
	if st == task.StatusRunning || st == task.StatusPaused {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s is still running", r.ID+r.ExecID)
	}
	if st == task.StatusCreated {
		at = time.Now()
	}
	if r.ExecID != "" {
		s.mu.Lock()
		delete(c.execs, r.ExecID)
		s.mu.Unlock()
		return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: at}, nil
	}
	if err := c.destroy(ctx); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	s.mu.Lock()
	delete(s.containers, r.ID)
	s.mu.Unlock()
	s.send(&eventstypes.TaskDelete{ContainerID: c.id, Pid: pid, ExitStatus: status, ExitedAt: at})
	return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: at}, nil
}

// destroy deletes the sandbox (waiting until its VM is gone), or an app
// container's copy in its pod's VM, and unmounts the rootfs.
func (c *container) destroy(ctx context.Context) error {
	c.ports.close()
	var err error
	if c.guestDir != "" {
		err = c.removeFromPod(ctx)
	} else {
		err = c.client.call(ctx, "DELETE", "/v1/sandboxes/"+c.sandbox+"?wait=true", nil, nil)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	os.Remove(filepath.Join(c.bundle, recordFile))
	if c.rootfs != "" {
		if err := mount.UnmountAll(c.rootfs, 0); err != nil {
			return fmt.Errorf("unmounting rootfs: %w", err)
		}
	}
	return nil
}

func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := c.init.state(); st == task.StatusStopped {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s is stopped", r.ID)
	}
	v, err := typeurl.UnmarshalAny(r.Spec)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "exec spec: %v", err)
	}
	spec, ok := v.(*specs.Process)
	if !ok || len(spec.Args) == 0 {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "exec spec: no process args")
	}
	s.mu.Lock()
	if _, ok := c.execs[r.ExecID]; ok {
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "exec %s already exists", r.ExecID)
	}
	if c.guestDir != "" {
		spec = inPod(c.guestDir, spec)
	}
	p := newProcess(r.ExecID, spec, r.Stdin, r.Stdout, r.Stderr, r.Terminal)
	p.limits = c.limits // a terminal's too: airlockd's PTY start takes the exec limits
	c.execs[r.ExecID] = p
	s.mu.Unlock()
	s.send(&eventstypes.TaskExecAdded{ContainerID: c.id, ExecID: r.ExecID})
	return empty, nil
}

func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	st, pid, status, at := p.state()
	return &taskAPI.StateResponse{ID: r.ID, ExecID: r.ExecID, Bundle: c.bundle, Pid: pid, Status: st,
		Stdin: p.stdin, Stdout: p.stdout, Stderr: p.stderr, Terminal: p.terminal, ExitStatus: status,
		ExitedAt: at}, nil
}

func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	_, _, status, at := p.state()
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: at}, nil
}

func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	c, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if st, _, _, _ := p.state(); st == task.StatusCreated && r.ExecID == "" {
		// Never started: it ends as killed, as runc's created container does.
		p.finish(128+r.Signal, func(p *process) { s.exited(c, p) })
		return empty, nil
	}
	if st, _, _, _ := c.init.state(); st == task.StatusPaused {
		// Thawed first: a frozen process would take the signal only when
		// thawed, and a cgroup left frozen would freeze the guest agent's
		// next exec that reuses it.
		if err := s.setFrozen(ctx, c, s.processesIn(c, task.StatusPaused), false); err != nil {
			return nil, err
		}
		s.send(&eventstypes.TaskResumed{ContainerID: c.id})
	}
	if err := p.kill(ctx, c.client, c.sandbox, r.Signal); err != nil {
		return nil, err
	}
	return empty, nil
}

func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	_, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if err := p.resize(r.Width, r.Height); err != nil {
		return nil, err
	}
	return empty, nil
}

func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.process(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if r.Stdin {
		p.closeStdin()
	}
	return empty, nil
}

func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	var procs []*task.ProcessInfo
	add := func(p *process) {
		if st, pid, _, _ := p.state(); st == task.StatusRunning || st == task.StatusPaused {
			procs = append(procs, &task.ProcessInfo{Pid: pid})
		}
	}
	add(c.init)
	s.mu.Lock()
	for _, e := range c.execs {
		add(e)
	}
	s.mu.Unlock()
	return &taskAPI.PidsResponse{Processes: procs}, nil
}

// Stats reports the sandbox's host-side figures (QEMU's CPU time and
// resident memory) in cgroup v2's metrics type, which ctr and the CRI read.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	c, err := s.get(r.ID)
	if err != nil {
		return nil, err
	}
	var st sandboxStats
	if err := c.client.call(ctx, "GET", "/v1/sandboxes/"+c.sandbox+"/stats", nil, &st); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	any, err := typeurl.MarshalAny(&v2stats.Metrics{
		CPU:    &v2stats.CPUStat{UsageUsec: uint64(st.CPUSeconds * 1e6)},
		Memory: &v2stats.MemoryStat{Usage: st.MemoryBytes},
	})
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: any}, nil
}

func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	var pid uint32
	if c, err := s.get(r.ID); err == nil {
		_, pid, _, _ = c.init.state()
	}
	return &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid()), TaskPid: pid}, nil
}

func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.containers) > 0 {
		return empty, nil
	}
	s.shutdown.Shutdown()
	return empty, nil
}

func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint is not supported by airlock's shim")
}

func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "update of resources is not supported by airlock's shim")
}
