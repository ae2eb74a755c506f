package main

// Where airlockd is: the runtime's options (a config file named by
// runtimeoptions' ConfigPath: `ctr run --runtime-config-path`, or the CRI
// runtime's `options.ConfigPath`), else $AIRLOCK_SOCKET, else the CLI's
// default for root (/var/lib/airlock/airlockd.sock).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/errdefs"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/typeurl"
	ptypes "github.com/gogo/protobuf/types"
	"github.com/pelletier/go-toml"
)

const defaultSocket = "/var/lib/airlock/airlockd.sock"

type config struct {
	Socket string `toml:"socket"`
}

func loadConfig(options *ptypes.Any) (*config, error) {
	cfg := &config{Socket: os.Getenv("AIRLOCK_SOCKET")}
	if cfg.Socket == "" {
		cfg.Socket = defaultSocket
	}
	if options == nil || options.TypeUrl == "" {
		return cfg, nil
	}
	v, err := typeurl.UnmarshalAny(options)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "runtime options: %v", err)
	}
	opts, ok := v.(*runtimeoptions.Options)
	if !ok {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "runtime options: %s is not runtimeoptions.v1.Options",
			options.TypeUrl)
	}
	if opts.ConfigPath == "" {
		return cfg, nil
	}
	data, err := os.ReadFile(opts.ConfigPath)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "runtime config: %v", err)
	}
	var file config
	if err := toml.Unmarshal(data, &file); err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "runtime config %s: %v", opts.ConfigPath, err)
	}
	if file.Socket != "" {
		if !filepath.IsAbs(file.Socket) {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "runtime config %s: socket %q is not absolute",
				opts.ConfigPath, file.Socket)
		}
		cfg.Socket = file.Socket
	}
	return cfg, nil
}

// The bundle's record of the container's sandbox, for `delete` after a shim died.
const recordFile = "airlock.json"

type record struct {
	Sandbox string `json:"sandbox"`
	Socket  string `json:"socket"`
}

func writeRecord(bundle string, r record) error {
	data, _ := json.Marshal(r)
	tmp := filepath.Join(bundle, recordFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(bundle, recordFile))
}

func readRecord(bundle string) (*record, error) {
	data, err := os.ReadFile(filepath.Join(bundle, recordFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %v", recordFile, err)
	}
	return &r, nil
}
