package main

// One process of a container: the init process (the OCI spec's) or an
// exec. It runs as an airlock exec in the container's sandbox: a streaming
// exec (NDJSON output, stdin through .../stdin) or, for a terminal, the
// PTY WebSocket; its stdio is pumped to and from containerd's fifos.

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/log"
	"github.com/containerd/fifo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

type process struct {
	id                    string // exec id; "" for init
	spec                  *specs.Process
	stdin, stdout, stderr string
	terminal              bool

	mu           sync.Mutex
	status       task.Status
	pid          uint32
	execID       string // airlock's
	exitStatus   uint32
	exitedAt     time.Time
	cancel       context.CancelFunc
	wsSend       func(ptyFrame) error
	stdinFifo    io.ReadCloser
	stdinSend    func([]byte, bool) error // set once the pump runs
	stdinClosing bool                     // CloseIO was called
	limits       *execLimits              // the container's memory limit (nil: none)
	oomKilled    bool                     // the guest's OOM killer killed part of it

	exited  chan struct{} // closed once the exit is recorded (and published)
	started chan struct{} // closed once the start event is published
}

func newProcess(id string, spec *specs.Process, stdin, stdout, stderr string, terminal bool) *process {
	return &process{id: id, spec: spec, stdin: stdin, stdout: stdout, stderr: stderr, terminal: terminal,
		status: task.StatusCreated, exited: make(chan struct{}), started: make(chan struct{})}
}

func (p *process) state() (task.Status, uint32, uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status, p.pid, p.exitStatus, p.exitedAt
}

// envMap is the spec's K=V list as airlock's env object (later wins).
func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" {
			m[k] = v
		}
	}
	return m
}

func userOf(spec *specs.Process) *uint32 {
	uid := spec.User.UID
	return &uid
}

// openWriter opens one of containerd's output fifos ("" = none: discarded).
// It holds a reader of its own open too, as runc's shim does: while
// containerd is down (a restart) a write then waits on a full pipe instead
// of failing with EPIPE and losing the output, and the restarted containerd
// reads on from the same fifo.
func openWriter(ctx context.Context, path string) (io.WriteCloser, error) {
	if path == "" {
		return nopWriteCloser{io.Discard}, nil
	}
	w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	r, err := fifo.OpenFifo(ctx, path, syscall.O_RDONLY, 0)
	if err != nil {
		w.Close()
		return nil, err
	}
	return heldFifo{w, r}, nil
}

type heldFifo struct {
	io.WriteCloser
	reader io.Closer
}

func (f heldFifo) Close() error {
	err := f.WriteCloser.Close()
	f.reader.Close()
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// start runs the process in sandbox sid; it returns once the process has
// started (its pid known). onExit is called once, after its output has
// been written out, with the exit recorded.
func (p *process) start(ctx context.Context, a *airlock, sid string, onExit func(*process)) error {
	bg, cancel := context.WithCancel(log.WithLogger(context.Background(), log.G(ctx)))
	ok := false
	defer func() {
		if !ok {
			cancel()
		}
	}()
	var err error
	if p.stdin != "" {
		if p.stdinFifo, err = fifo.OpenFifo(bg, p.stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			return err
		}
	}
	if p.terminal {
		err = p.startPty(bg, a, sid, onExit)
	} else {
		err = p.startExec(bg, a, sid, onExit)
	}
	if err != nil {
		if p.stdinFifo != nil {
			p.stdinFifo.Close()
		}
		return err
	}
	p.mu.Lock()
	p.cancel = cancel
	p.mu.Unlock()
	ok = true
	return nil
}

func (p *process) startExec(ctx context.Context, a *airlock, sid string, onExit func(*process)) error {
	stdout, err := openWriter(ctx, p.stdout)
	if err != nil {
		return err
	}
	stderr, err := openWriter(ctx, p.stderr)
	if err != nil {
		stdout.Close()
		return err
	}
	closeOut := func() { stdout.Close(); stderr.Close() }
	req := &execRequest{Argv: p.spec.Args, Env: envMap(p.spec.Env), Cwd: p.spec.Cwd, User: userOf(p.spec),
		OutputLimit: 1 << 40, StdinStream: p.stdinFifo != nil, Limits: p.limits}
	stream, err := a.exec(ctx, sid, req)
	if err != nil {
		closeOut()
		return err
	}
	first, err := stream.next()
	if err != nil || first.Type != "start" {
		stream.close()
		closeOut()
		if err == nil && first.Error != nil {
			return streamError(first.Error)
		}
		return errdefs.ToGRPCf(errdefs.ErrUnknown, "airlockd exec: no start event (%v)", err)
	}
	p.mu.Lock()
	p.status, p.pid, p.execID = task.StatusRunning, first.Pid, first.ExecID
	p.mu.Unlock()
	if p.stdinFifo != nil {
		go p.pumpStdin(ctx, func(data []byte, eof bool) error { return a.stdin(ctx, sid, first.ExecID, data, eof) })
	}
	go func() {
		defer stream.close()
		status := uint32(255)
		for {
			ev, err := stream.next()
			if err != nil {
				log.G(ctx).WithError(err).Warn("exec stream of process ended without an exit")
				break
			}
			switch ev.Type {
			case "stdout":
				stdout.Write(ev.Data)
				continue
			case "stderr":
				stderr.Write(ev.Data)
				continue
			case "exit":
				status = ev.exitStatus()
				if ev.Reason == "oom_killed" {
					p.mu.Lock()
					p.oomKilled = true
					p.mu.Unlock()
				}
			case "error":
				log.G(ctx).Warnf("exec of process ended by airlockd: %s", ev.Error.describe())
			}
			break
		}
		closeOut()
		p.finish(status, onExit)
	}()
	return nil
}

func streamError(e *apiError) error {
	k := errdefs.ErrUnknown
	switch e.Code {
	case "not_found":
		k = errdefs.ErrNotFound
	case "invalid_argument":
		k = errdefs.ErrInvalidArgument
	case "conflict":
		k = errdefs.ErrFailedPrecondition
	}
	return errdefs.ToGRPCf(k, "airlockd exec: %s", e.describe())
}

// pumpStdin feeds the stdin fifo to the process until the fifo's EOF;
// then (or once CloseIO gave up waiting for it) the process's stdin is closed.
func (p *process) pumpStdin(ctx context.Context, send func([]byte, bool) error) {
	p.mu.Lock()
	p.stdinSend = send
	closing := p.stdinClosing
	p.mu.Unlock()
	if closing {
		go p.stdinGrace()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := p.stdinFifo.Read(buf)
		if n > 0 {
			if send(buf[:n], false) != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	send(nil, true)
}

// closeStdin is CloseIO: containerd's client closes its end of the fifo
// right after, so the pump delivers what is still in the fifo and then
// its EOF; a writer that stays open is cut off after a grace period.
func (p *process) closeStdin() {
	p.mu.Lock()
	already := p.stdinClosing
	p.stdinClosing = true
	pumping := p.stdinSend != nil
	p.mu.Unlock()
	if pumping && !already {
		go p.stdinGrace()
	}
}

func (p *process) stdinGrace() {
	select {
	case <-time.After(2 * time.Second):
		p.stdinFifo.Close()
	case <-p.exited:
	}
}

func (p *process) startPty(ctx context.Context, a *airlock, sid string, onExit func(*process)) error {
	stdout, err := openWriter(ctx, p.stdout)
	if err != nil {
		return err
	}
	cols, rows := uint32(80), uint32(24)
	if p.spec.ConsoleSize != nil && p.spec.ConsoleSize.Width > 0 && p.spec.ConsoleSize.Height > 0 {
		cols, rows = uint32(p.spec.ConsoleSize.Width), uint32(p.spec.ConsoleSize.Height)
	}
	ws, err := a.pty(ctx, sid, &ptyStart{Argv: p.spec.Args, Cols: cols, Rows: rows, Env: envMap(p.spec.Env),
		Cwd: p.spec.Cwd, User: userOf(p.spec), Limits: p.limits})
	if err != nil {
		stdout.Close()
		return err
	}
	var first execEvent
	for {
		var f ptyFrame
		if err := ptyCodec.Receive(ws, &f); err != nil {
			ws.Close()
			stdout.Close()
			return errdefs.ToGRPCf(errdefs.ErrUnknown, "airlockd pty: no start event (%v)", err)
		}
		if f.text && json.Unmarshal(f.data, &first) == nil {
			break
		}
	}
	if first.Type != "start" {
		ws.Close()
		stdout.Close()
		if first.Error != nil {
			return streamError(first.Error)
		}
		return errdefs.ToGRPCf(errdefs.ErrUnknown, "airlockd pty: %s before start", first.Type)
	}
	var sendMu sync.Mutex
	send := func(f ptyFrame) error { sendMu.Lock(); defer sendMu.Unlock(); return ptyCodec.Send(ws, f) }
	p.mu.Lock()
	// The start event's pid is the terminal process's in the guest (Pause
	// freezes its cgroup by it).
	p.status, p.pid, p.execID, p.wsSend = task.StatusRunning, first.Pid, first.ExecID, send
	p.mu.Unlock()
	if p.stdinFifo != nil {
		// A terminal has no EOF of its own: closing stdin sends ^D, as a tty would.
		go p.pumpStdin(ctx, func(data []byte, eof bool) error {
			if eof {
				return send(ptyFrame{data: []byte{4}})
			}
			return send(ptyFrame{data: data})
		})
	}
	go func() {
		status := uint32(255)
		for {
			var f ptyFrame
			if err := ptyCodec.Receive(ws, &f); err != nil {
				break
			}
			if !f.text {
				stdout.Write(f.data)
				continue
			}
			var ev execEvent
			if json.Unmarshal(f.data, &ev) != nil {
				continue
			}
			if ev.Type == "exit" {
				status = ev.exitStatus()
				break
			}
			if ev.Type == "error" && ev.Error != nil {
				log.G(ctx).Warnf("pty of process ended by airlockd: %s", ev.Error.describe())
				break
			}
		}
		ws.Close()
		stdout.Close()
		p.finish(status, onExit)
	}()
	return nil
}

// finish records the exit once and hands it to onExit after the start was
// published (containerd must see start before exit).
func (p *process) finish(status uint32, onExit func(*process)) {
	p.mu.Lock()
	if p.status == task.StatusStopped {
		p.mu.Unlock()
		return
	}
	p.status, p.exitStatus, p.exitedAt = task.StatusStopped, status, time.Now()
	cancel, in := p.cancel, p.stdinFifo
	p.mu.Unlock()
	if in != nil {
		in.Close()
	}
	<-p.started
	if onExit != nil {
		onExit(p)
	}
	close(p.exited)
	if cancel != nil {
		cancel()
	}
}

// kill signals the running process's tree.
func (p *process) kill(ctx context.Context, a *airlock, sid string, signal uint32) error {
	p.mu.Lock()
	status, execID, send := p.status, p.execID, p.wsSend
	p.mu.Unlock()
	if status == task.StatusStopped {
		return errdefs.ToGRPCf(errdefs.ErrNotFound, "process already finished")
	}
	if status == task.StatusCreated {
		return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process not started")
	}
	if send != nil {
		data, _ := json.Marshal(map[string]uint32{"signal": signal})
		return send(ptyFrame{text: true, data: data})
	}
	err := a.killExec(ctx, sid, execID, signal)
	if errdefs.IsNotFound(err) {
		return errdefs.ToGRPCf(errdefs.ErrNotFound, "process already finished")
	}
	return errdefs.ToGRPC(err)
}

func (p *process) resize(width, height uint32) error {
	p.mu.Lock()
	send := p.wsSend
	p.mu.Unlock()
	if send == nil {
		return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process has no terminal")
	}
	if width == 0 || height == 0 || width > 4096 || height > 4096 {
		// A terminal of no size (a client's unset pty) is not a size: airlockd
		// would end the session over it.
		return nil
	}
	data, _ := json.Marshal(map[string]map[string]uint32{"resize": {"cols": width, "rows": height}})
	return send(ptyFrame{text: true, data: data})
}
