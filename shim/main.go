// containerd-shim-airlock-v2: containerd's runtime io.containerd.airlock.v2.
// Each container is an airlock sandbox (a microVM) made by the node's
// airlockd; the shim is a thin client of airlockd's HTTP API.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containerd/containerd/log"
	"github.com/containerd/containerd/mount"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/runtime/v2/shim"
	taskAPI "github.com/containerd/containerd/runtime/v2/task"
)

const runtimeName = "io.containerd.airlock.v2"

func main() {
	shim.Run(runtimeName, newShim)
}

type airlockShim struct {
	*service
	id string
}

func newShim(ctx context.Context, id string, publisher shim.Publisher, fn func()) (shim.Shim, error) {
	sd, ok := ctx.(shutdown.Service)
	if !ok {
		ctx, sd = shutdown.WithShutdown(ctx)
		sd.RegisterCallback(func(context.Context) error { fn(); return nil })
	}
	return &airlockShim{service: newService(ctx, publisher, sd), id: id}, nil
}

// StartShim (`start`): re-executes this binary as the long-lived shim
// serving ttrpc on a socket of containerd's naming and prints its address.
func (s *airlockShim) StartShim(ctx context.Context, opts shim.StartOpts) (_ string, retErr error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return "", err
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	// A pod's containers share the shim of its sandbox container (and its VM).
	address, err := shim.SocketAddress(ctx, opts.Address, shimGroup(opts.ID, bundleAnnotations()))
	if err != nil {
		return "", err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("create new shim socket: %w", err)
		}
		if shim.CanConnect(address) {
			if err := shim.WriteAddress("address", address); err != nil {
				return "", err
			}
			return address, nil
		}
		if err := shim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("remove pre-existing socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return "", fmt.Errorf("create new shim socket 2x: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			shim.RemoveSocket(address)
		}
	}()
	if err := shim.WriteAddress("address", address); err != nil {
		return "", err
	}
	f, err := socket.File()
	if err != nil {
		return "", err
	}
	defer f.Close()
	args := []string{"-namespace", ns, "-id", opts.ID, "-address", opts.Address}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir, _ = os.Getwd()
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go cmd.Wait()
	// containerd writes the runtime's options on stdin; the task gets them again at Create.
	io.Copy(io.Discard, os.Stdin)
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		return "", fmt.Errorf("adjust OOM score of the shim: %w", err)
	}
	return address, nil
}

// Cleanup (`delete`): containerd lost the shim (it died or was killed);
// the container's sandbox goes and the rootfs is unmounted. The bundle is
// the working directory.
func (s *airlockShim) Cleanup(ctx context.Context) (*taskAPI.DeleteResponse, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	if rec, err := readRecord(bundle); err == nil && rec.Sandbox != "" {
		err := newAirlock(rec.Socket).call(ctx, "DELETE", "/v1/sandboxes/"+rec.Sandbox+"?wait=true", nil, nil)
		if err != nil {
			log.G(ctx).WithError(err).Warn("delete of the container's sandbox")
		}
	} else if err != nil && !os.IsNotExist(err) {
		log.G(ctx).WithError(err).Warn("reading the container's record")
	}
	os.Remove(filepath.Join(bundle, recordFile))
	if err := mount.UnmountAll(filepath.Join(bundle, "rootfs"), 0); err != nil {
		log.G(ctx).WithError(err).Warn("unmount of the rootfs")
	}
	// A shim that was killed could not remove its socket. containerd runs
	// `delete` after every task's end too, and a pod's app container shares
	// its pod's live shim (and socket): that one stays.
	if address, err := shim.ReadAddress(filepath.Join(bundle, "address")); err == nil && !shim.CanConnect(address) {
		shim.RemoveSocket(address)
	}
	return &taskAPI.DeleteResponse{ExitedAt: time.Now(), ExitStatus: 128 + uint32(syscall.SIGKILL)}, nil
}

// bundleAnnotations are the OCI spec's annotations of the bundle `start`
// runs in (its working directory); none if it cannot be read.
func bundleAnnotations() map[string]string {
	data, err := os.ReadFile("config.json")
	if err != nil {
		return nil
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(data, &spec) != nil {
		return nil
	}
	return spec.Annotations
}
