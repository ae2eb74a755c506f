package main

// Kata's mapping, one microVM per pod: containerd's CRI marks the pod's
// sandbox (pause) container and its app containers with annotations; all of
// a pod's containers share one shim (StartShim groups them by the pod's id)
// and the sandbox container's airlock sandbox. An app container's root
// filesystem is COPIED into that VM (a tar of containerd's mounted rootfs,
// uploaded through airlockd's files API and unpacked by airlock-ctr-init
// under /.airlock-ctr/<id>/rootfs), and its processes run chrooted there.
// A copy, not a live share: writes on either side are not seen by the
// other, and the copy costs time and guest disk in proportion to the image.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/log"
	taskAPI "github.com/containerd/containerd/runtime/v2/task"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	annotationContainerType = "io.kubernetes.cri.container-type"
	annotationSandboxID     = "io.kubernetes.cri.sandbox-id"
	containerTypeSandbox    = "sandbox"
	containerTypeContainer  = "container"

	guestCtrDir  = "/.airlock-ctr"
	guestCtrInit = guestCtrDir + "/airlock-ctr-init"
	ctrInitName  = "airlock-ctr-init"
)

// podRole is the container's CRI type ("sandbox", "container" or "" when
// it is no pod's) and its pod's id.
func podRole(annotations map[string]string) (kind, podID string) {
	return annotations[annotationContainerType], annotations[annotationSandboxID]
}

// shimGroup is the id a container's shim is named by: its pod's, so that a
// pod's containers reach the same shim (as runc's v2 shim groups them).
func shimGroup(id string, annotations map[string]string) string {
	if _, podID := podRole(annotations); podID != "" {
		return podID
	}
	return id
}

var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// ctrInitPath is the airlock-ctr-init the shim uploads: $AIRLOCK_CTR_INIT,
// else the one installed beside the shim.
func ctrInitPath() string {
	if p := os.Getenv("AIRLOCK_CTR_INIT"); p != "" {
		return p
	}
	self, err := os.Executable()
	if err != nil {
		return ctrInitName
	}
	return filepath.Join(filepath.Dir(self), ctrInitName)
}

// createInPod copies the app container's rootfs into its pod's VM.
func (s *service) createInPod(ctx context.Context, r *taskAPI.CreateTaskRequest, spec *specs.Spec, cfg *config,
	podID, rootfs string) (_ *container, retErr error) {
	if !safeID.MatchString(r.ID) {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "container id %q: not 1-128 of A-Z a-z 0-9 _ . -", r.ID)
	}
	pod, err := s.get(podID)
	if err != nil || pod.guestDir != "" {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition,
			"container %s: its pod's sandbox container %s (annotation %s) is not running in this shim", r.ID, podID,
			annotationSandboxID)
	}
	// Refused before anything is made in the VM.
	limits, err := memoryLimit(spec, pod.memoryMB)
	if err != nil {
		return nil, err
	}
	if err := pod.ensureCtrInit(ctx); err != nil {
		return nil, err
	}
	dir := guestCtrDir + "/" + r.ID
	c := &container{id: r.ID, bundle: r.Bundle, sandbox: pod.sandbox, client: pod.client, guestDir: dir,
		execs: map[string]*process{}, limits: limits}
	if err := c.copyIntoPod(ctx, rootfs); err != nil {
		c.removeFromPod(context.Background())
		return nil, err
	}
	// No sandbox of its own: a dead shim's `delete` leaves the pod's VM to
	// the pod's sandbox container.
	if err := writeRecord(r.Bundle, record{Socket: cfg.Socket}); err != nil {
		c.removeFromPod(context.Background())
		return nil, err
	}
	c.init = newProcess("", inPod(dir, spec.Process), r.Stdin, r.Stdout, r.Stderr, r.Terminal)
	c.init.limits = limits
	log.G(ctx).Infof("container %s runs in pod %s's airlock sandbox %s (rootfs copied to %s)", r.ID, podID,
		pod.sandbox, dir)
	return c, nil
}

// ensureCtrInit uploads airlock-ctr-init into the pod's VM, once.
func (c *container) ensureCtrInit(ctx context.Context) error {
	c.initMu.Lock()
	defer c.initMu.Unlock()
	if c.initUp {
		return nil
	}
	path := ctrInitPath()
	f, err := os.Open(path)
	if err != nil {
		return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition,
			"%s (what runs a pod's app containers in its VM) is not installed beside the shim: %v", ctrInitName, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := c.client.mkdir(ctx, c.sandbox, guestCtrDir); err != nil {
		return errdefs.ToGRPC(err)
	}
	if err := c.client.putFile(ctx, c.sandbox, guestCtrInit, f, fi.Size(), "0755"); err != nil {
		return errdefs.ToGRPC(err)
	}
	c.initUp = true
	return nil
}

// copyIntoPod uploads the rootfs as one tar and unpacks it in the VM.
func (c *container) copyIntoPod(ctx context.Context, rootfs string) error {
	_, size, err := layerDigest(rootfs)
	if err != nil {
		return fmt.Errorf("reading the container's rootfs: %w", err)
	}
	tarPath := c.guestDir + ".tar"
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeLayer(rootfs, pw)) }()
	err = c.client.putFile(ctx, c.sandbox, tarPath, pr, size, "0600")
	pr.Close()
	if err != nil {
		return errdefs.ToGRPC(err)
	}
	return c.client.runSync(ctx, c.sandbox, []string{guestCtrInit, "unpack", tarPath, c.guestDir})
}

// removeFromPod unmounts and removes the container's copy (gone with the
// pod's VM if that went first).
func (c *container) removeFromPod(ctx context.Context) error {
	err := c.client.runSync(ctx, c.sandbox, []string{guestCtrInit, "remove", c.guestDir})
	if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) {
		return nil
	}
	return err
}

// inPod is the process as airlock runs it in the pod's VM: as root, through
// airlock-ctr-init, which chroots into the container's copy, changes to its
// cwd, drops to its user and execs its argv.
func inPod(dir string, p *specs.Process) *specs.Process {
	q := *p
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	args := []string{guestCtrInit, "run", "-root", dir + "/rootfs", "-cwd", cwd,
		"-uid", strconv.FormatUint(uint64(p.User.UID), 10), "-gid", strconv.FormatUint(uint64(p.User.GID), 10)}
	if len(p.User.AdditionalGids) > 0 {
		var gids []string
		for _, g := range p.User.AdditionalGids {
			gids = append(gids, strconv.FormatUint(uint64(g), 10))
		}
		args = append(args, "-groups", strings.Join(gids, ","))
	}
	q.Args = append(append(args, "--"), p.Args...)
	q.Cwd = "/"
	q.User = specs.User{}
	return &q
}
