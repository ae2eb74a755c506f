package main

// The pod IP reaching a port in the guest: for each port the annotation
// airlock.dev/ports names, airlockd forwards a loopback port of its host
// to the guest's TCP port (POST .../ports), and the shim listens on that
// port in the pod's network namespace (the one CNI gave the pod IP) and
// relays each connection to airlockd's forward. The VM itself is not in
// the pod's network namespace: its egress stays airlock's policy.

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

const (
	annotationPorts = "airlock.dev/ports"
	maxPorts        = 16
)

// parsePorts reads "8080,9090" (TCP ports 1-65535, at most maxPorts, no repeats).
func parsePorts(v string) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 65535 || seen[n] {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument,
				"annotation %s: %q is not a list of distinct TCP ports 1-65535", annotationPorts, v)
		}
		seen[n] = true
		ports = append(ports, n)
	}
	if len(ports) > maxPorts {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "annotation %s: more than %d ports", annotationPorts,
			maxPorts)
	}
	return ports, nil
}

// netnsPath is the spec's network namespace to join ("": the shim's own).
func netnsPath(spec *specs.Spec) string {
	if spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// listenIn listens on TCP port on every address of the network namespace
// at path. The socket is made on a thread moved into that namespace; the
// thread is never unlocked, so it ends with its goroutine and no other
// goroutine runs in the pod's namespace.
func listenIn(path string, port int) (net.Listener, error) {
	addr := fmt.Sprintf(":%d", port)
	if path == "" {
		return net.Listen("tcp", addr)
	}
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{nil, fmt.Errorf("network namespace %s: %v", path, err)}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("joining network namespace %s: %v", path, err)}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// forwards are a container's listeners in its pod's namespace.
type forwards struct {
	mu        sync.Mutex
	listeners []net.Listener
}

// start forwards each port from the namespace at path to the sandbox's guest.
func (f *forwards) start(ctx context.Context, a *airlock, sid, path string, ports []int) error {
	for _, port := range ports {
		pf, err := a.forwardPort(ctx, sid, port)
		if err != nil {
			return errdefs.ToGRPC(err)
		}
		l, err := listenIn(path, port)
		if err != nil {
			return errdefs.ToGRPCf(errdefs.ErrUnknown, "port %d in the pod's network namespace: %v", port, err)
		}
		f.mu.Lock()
		f.listeners = append(f.listeners, l)
		f.mu.Unlock()
		go relay(ctx, l, net.JoinHostPort(pf.Host, strconv.Itoa(pf.HostPort)))
	}
	return nil
}

func (f *forwards) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.listeners {
		l.Close()
	}
	f.listeners = nil
}

// relay copies each accepted connection to and from target until the listener closes.
func relay(ctx context.Context, l net.Listener, target string) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := net.Dial("tcp", target)
			if err != nil {
				log.G(ctx).WithError(err).Warnf("relay to airlockd's forward %s", target)
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(out, in)
			go pipe(in, out)
			<-done
			<-done
		}()
	}
}
