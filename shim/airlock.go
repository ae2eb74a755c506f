package main

// A small client of airlockd's HTTP API over its unix socket: the calls the
// shim needs, with airlockd's JSON errors turned into containerd's error
// kinds (errdefs) so containerd and ctr show the daemon's message.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/containerd/containerd/errdefs"
	"golang.org/x/net/websocket"
)

type airlock struct {
	socket string
	http   *http.Client
}

func newAirlock(socket string) *airlock {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableCompression: true,
	}
	return &airlock{socket: socket, http: &http.Client{Transport: tr}}
}

// apiError is airlockd's {"error":{"code","message","field"}}.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

func (e *apiError) describe() string {
	if e.Field != "" {
		return fmt.Sprintf("%s (field %s)", e.Message, e.Field)
	}
	return e.Message
}

// kind maps an HTTP status of airlockd to containerd's error kind.
func kind(status int) error {
	switch {
	case status == http.StatusNotFound:
		return errdefs.ErrNotFound
	case status == http.StatusConflict:
		return errdefs.ErrFailedPrecondition
	case status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge:
		return errdefs.ErrInvalidArgument
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable ||
		status == http.StatusGatewayTimeout:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrUnknown
}

func (a *airlock) unreachable(err error) error {
	return fmt.Errorf("airlockd at %s: %v: %w", a.socket, err, errdefs.ErrUnavailable)
}

func readError(method, path string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error apiError `json:"error"`
	}
	msg := strings.TrimSpace(string(data))
	if json.Unmarshal(data, &body) == nil && body.Error.Message != "" {
		msg = body.Error.describe()
	}
	return fmt.Errorf("airlockd %s %s: %d %s: %w", method, path, resp.StatusCode, msg, kind(resp.StatusCode))
}

// do sends one request; a non-2xx answer is returned as an error (body read).
func (a *airlock) do(ctx context.Context, method, path string, body io.Reader, ctype string) (*http.Response, error) {
	return a.doSized(ctx, method, path, body, -1, ctype)
}

// doSized is do with the body's length given (-1: the reader's own, if known).
func (a *airlock) doSized(ctx context.Context, method, path string, body io.Reader, size int64,
	ctype string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://airlockd"+path, body)
	if err != nil {
		return nil, err
	}
	if size >= 0 {
		req.ContentLength = size
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, a.unreachable(err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, readError(method, path, resp)
	}
	return resp, nil
}

// call sends `in` as JSON (nil: no body) and decodes the answer into `out` (nil: dropped).
func (a *airlock) call(ctx context.Context, method, path string, in, out interface{}) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(data), "application/json"
	}
	resp, err := a.do(ctx, method, path, body, ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

type sandboxSpec struct {
	Image    string            `json:"image"`
	Cpus     int               `json:"cpus,omitempty"`
	MemoryMB int               `json:"memory_mb,omitempty"`
	DiskMB   int               `json:"disk_mb,omitempty"`
	Timeout  int               `json:"timeout"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  *networkPolicy    `json:"network,omitempty"`
	Ports    []int             `json:"-"` // guest TCP ports the pod's network namespace forwards (ports.go)
}

type networkPolicy struct {
	Mode string `json:"mode"`
}

type sandbox struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	MemoryMB int    `json:"memory_mb"`
}

type image struct {
	Name        string `json:"name"`
	RootfsBytes int64  `json:"rootfs_bytes"`
}

type sandboxStats struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	MemoryBytes uint64  `json:"memory_bytes"`
}

type execRequest struct {
	Argv        []string          `json:"argv"`
	Env         map[string]string `json:"env,omitempty"`
	Cwd         string            `json:"cwd,omitempty"`
	User        *uint32           `json:"user,omitempty"`
	Timeout     int               `json:"timeout"`
	OutputLimit int64             `json:"output_limit_bytes"`
	StdinStream bool              `json:"stdin_stream,omitempty"`
	Limits      *execLimits       `json:"limits,omitempty"`
}

// execLimits are the limits of an exec's own cgroup in the guest.
type execLimits struct {
	MemoryMB int64 `json:"memory_mb,omitempty"`
}

// execEvent is one line of the exec NDJSON stream (and a PTY text frame).
type execEvent struct {
	Type     string    `json:"type"`
	ExecID   string    `json:"exec_id"`
	Pid      uint32    `json:"pid"`
	Data     []byte    `json:"data"` // base64 in the stream; encoding/json decodes it
	ExitCode *int      `json:"exit_code"`
	Signal   *int      `json:"signal"`
	Reason   string    `json:"reason"`
	Error    *apiError `json:"error"`
}

// exitStatus is the shell's convention: the code, or 128 + the signal.
func (e *execEvent) exitStatus() uint32 {
	if e.ExitCode != nil {
		return uint32(*e.ExitCode)
	}
	if e.Signal != nil {
		return 128 + uint32(*e.Signal)
	}
	return 255
}

// execStream starts a streaming exec; the caller reads events with next().
type execStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

func (a *airlock) exec(ctx context.Context, sid string, req *execRequest) (*execStream, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := a.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sid)+"/exec", bytes.NewReader(data),
		"application/json")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &execStream{body: resp.Body, sc: sc}, nil
}

func (s *execStream) next() (*execEvent, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return nil, err
		}
		return nil, io.ErrUnexpectedEOF
	}
	var ev execEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("airlockd exec stream: %v", err)
	}
	return &ev, nil
}

func (s *execStream) close() { s.body.Close() }

// stdin appends bytes to a streamed-stdin exec (eof closes it after them).
func (a *airlock) stdin(ctx context.Context, sid, execID string, data []byte, eof bool) error {
	path := "/v1/sandboxes/" + url.PathEscape(sid) + "/exec/" + url.PathEscape(execID) + "/stdin"
	if eof {
		path += "?eof=true"
	}
	resp, err := a.do(ctx, "POST", path, bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (a *airlock) killExec(ctx context.Context, sid, execID string, signal uint32) error {
	return a.call(ctx, "DELETE", fmt.Sprintf("/v1/sandboxes/%s/exec/%s?signal=%d", url.PathEscape(sid),
		url.PathEscape(execID), signal), nil, nil)
}

// ptyCodec tells text frames (JSON events) from binary ones (terminal bytes).
type ptyFrame struct {
	text bool
	data []byte
}

var ptyCodec = websocket.Codec{
	Marshal: func(v interface{}) ([]byte, byte, error) {
		f := v.(ptyFrame)
		if f.text {
			return f.data, websocket.TextFrame, nil
		}
		return f.data, websocket.BinaryFrame, nil
	},
	Unmarshal: func(data []byte, payloadType byte, v interface{}) error {
		f := v.(*ptyFrame)
		f.text = payloadType == websocket.TextFrame
		f.data = append([]byte(nil), data...)
		return nil
	},
}

type ptyStart struct {
	Argv   []string          `json:"argv"`
	Cols   uint32            `json:"cols"`
	Rows   uint32            `json:"rows"`
	Env    map[string]string `json:"env,omitempty"`
	Cwd    string            `json:"cwd,omitempty"`
	User   *uint32           `json:"user,omitempty"`
	Limits *execLimits       `json:"limits,omitempty"`
}

// pty opens the sandbox's terminal WebSocket and sends the start frame.
func (a *airlock) pty(ctx context.Context, sid string, start *ptyStart) (*websocket.Conn, error) {
	cfg, err := websocket.NewConfig("ws://airlockd/v1/sandboxes/"+url.PathEscape(sid)+"/pty", "http://airlockd")
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", a.socket)
	if err != nil {
		return nil, a.unreachable(err)
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("airlockd pty of %s: %v: %w", sid, err, errdefs.ErrUnavailable)
	}
	data, _ := json.Marshal(start)
	if err := ptyCodec.Send(ws, ptyFrame{text: true, data: data}); err != nil {
		ws.Close()
		return nil, err
	}
	return ws, nil
}

// mkdir makes a guest directory and its parents.
func (a *airlock) mkdir(ctx context.Context, sid, path string) error {
	return a.call(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sid)+"/files/mkdir",
		map[string]interface{}{"path": path, "parents": true}, nil)
}

// putFile writes size bytes of body to a guest file of the given octal mode.
func (a *airlock) putFile(ctx context.Context, sid, path string, body io.Reader, size int64, mode string) error {
	resp, err := a.doSized(ctx, "PUT", "/v1/sandboxes/"+url.PathEscape(sid)+"/files?path="+url.QueryEscape(path)+
		"&mode="+mode, body, size, "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// runSync runs argv as root in the sandbox and waits; a failure (exit
// status not 0) is an error carrying its stderr.
func (a *airlock) runSync(ctx context.Context, sid string, argv []string) error {
	root := uint32(0)
	stream, err := a.exec(ctx, sid, &execRequest{Argv: argv, User: &root, Timeout: 600, OutputLimit: 64 << 10})
	if err != nil {
		return err
	}
	defer stream.close()
	var stderr []byte
	for {
		ev, err := stream.next()
		if err != nil {
			return fmt.Errorf("%s in sandbox %s: %v", argv[0], sid, err)
		}
		switch ev.Type {
		case "stderr", "stdout":
			stderr = append(stderr, ev.Data...)
		case "error":
			return streamError(ev.Error)
		case "exit":
			if st := ev.exitStatus(); st != 0 {
				return fmt.Errorf("%s in sandbox %s: exit status %d: %s: %w", strings.Join(argv, " "), sid, st,
					strings.TrimSpace(string(stderr)), errdefs.ErrUnknown)
			}
			return nil
		}
	}
}

type portForward struct {
	Host     string `json:"host"`
	HostPort int    `json:"host_port"`
}

// forwardPort has airlockd forward a free loopback port of its host to the guest's TCP port.
func (a *airlock) forwardPort(ctx context.Context, sid string, guestPort int) (*portForward, error) {
	var pf portForward
	err := a.call(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(sid)+"/ports", map[string]int{"guest_port": guestPort},
		&pf)
	if err != nil {
		return nil, err
	}
	return &pf, nil
}
