package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/keel-rl/keel/kernels/cuda"
)

func init() {
	register(command{
		name:    "device",
		summary: "show what keel finds of CUDA here (driver, GPUs, NVRTC, cuBLASLt) and compile its kernels",
		run:     func(args []string) error { return runDevice(args, os.Stdout) },
	})
}

const deviceUsage = `usage: keel device [--arch N] [--sources a.cu,b.cu]

Shows the CUDA libraries keel loads at run time (the driver, NVRTC and
cuBLASLt: where each was found, or where it was looked for), the GPUs the
driver sees, and compiles keel's kernels for the first GPU into the kernel
cache, so that the first run on a new GPU starts at once (without a GPU,
for compute capability --arch: a check that they compile, since a GPU's
images are kept under its driver's version too). Exits with an error
when something a run on the GPU needs is missing.

keel looks for the libraries in KEEL_CUDA_LIBS (folders, separated by
colons), LD_LIBRARY_PATH, CUDA_HOME and CUDA_PATH, /usr/local/cuda, the
driver's usual folders, and the lib folders of NVIDIA's pip wheels (a
PyTorch install carries NVRTC and cuBLAS) in VIRTUAL_ENV, CONDA_PREFIX and
the system's and user's Python. The kernel cache is KEEL_CACHE_DIR/cuda, or
~/.cache/keel/cuda.

flags:
`

func runDevice(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), deviceUsage); fs.PrintDefaults() }
	arch := fs.Int("arch", 90, "compute capability times ten to compile for when there is no GPU (90: Hopper)")
	sources := fs.String("sources", "", "compile only these kernel sources (comma-separated, e.g. flash.cu,rows.cu): NVRTC compiles one source at a time in a process, so several keel device processes fill the cache faster")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var missing []string
	line := func(what, text string) { fmt.Fprintf(stdout, "%-9s %s\n", what, text) }

	var gpus []*cuda.Device
	if v, err := cuda.DriverVersion(); err != nil {
		line("driver", "not usable: "+err.Error())
		missing = append(missing, "the CUDA driver")
	} else {
		line("driver", fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10))
		n, err := cuda.DeviceCount()
		if err != nil || n == 0 {
			line("GPUs", fmt.Sprintf("none (%v)", err))
			missing = append(missing, "a GPU")
		}
		for i := 0; i < n; i++ {
			d, err := cuda.Open(i)
			if err != nil {
				line(fmt.Sprintf("GPU %d", i), err.Error())
				continue
			}
			defer d.Close()
			gpus = append(gpus, d)
			line(fmt.Sprintf("GPU %d", i), d.String())
		}
	}
	if c, err := cuda.LoadCublasLt(); err != nil {
		line("cuBLASLt", "not found: "+err.Error())
		missing = append(missing, "cuBLASLt")
	} else {
		line("cuBLASLt", fmt.Sprintf("%s  %s", c.VersionString(), c.Path))
	}
	n, err := cuda.LoadNVRTC()
	if err != nil {
		line("NVRTC", "not found: "+err.Error())
		missing = append(missing, "NVRTC")
	} else {
		line("NVRTC", fmt.Sprintf("%s  %s", n.Version(), n.Path))
		var names []string
		if *sources != "" {
			names = strings.Split(*sources, ",")
		}
		var gpu *cuda.Device
		if len(gpus) > 0 {
			gpu = gpus[0]
		}
		if err := compileKernels(stdout, n, *arch, gpu, names); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("not ready for the GPU, missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

// compileKernels builds the embedded kernel sources names (every one when
// names is empty) through the kernel cache, for gpu (under the key its
// runs look up, which holds its driver's version) or, without one, for
// arch (a check that they compile: a GPU's runs key their images by its
// driver too), and says how long each took and how many were cached.
func compileKernels(stdout io.Writer, n *cuda.NVRTC, arch int, gpu *cuda.Device, names []string) error {
	if len(names) == 0 {
		names = cuda.SourceNames()
	}
	for _, name := range names {
		if _, err := cuda.Source(name); err != nil {
			return err
		}
	}
	if gpu != nil {
		arch = gpu.Arch
	}
	t, err := n.Target(arch)
	if err != nil {
		return err
	}
	dir, err := cuda.DefaultCacheDir()
	if err != nil {
		return err
	}
	cache := &cuda.Cache{Dir: dir}
	start := time.Now()
	hits := 0
	var took []string
	for _, name := range names {
		began := time.Now()
		var hit bool
		if gpu != nil {
			var h int
			h, err = gpu.Precompile(name)
			hit = h == 1
		} else {
			src, _ := cuda.Source(name)
			_, hit, err = cache.Build(n, cuda.BuildKey{Name: name, Source: src, Options: cuda.KernelOptions, Target: t})
		}
		if err != nil {
			return err
		}
		if hit {
			hits++
		}
		took = append(took, fmt.Sprintf("%s %.1f s", name, time.Since(began).Seconds()))
	}
	fmt.Fprintf(stdout, "%-9s %d sources for %s in %.1f s (%d from the cache %s): %s\n", "kernels", len(names), t,
		time.Since(start).Seconds(), hits, dir, strings.Join(took, ", "))
	return nil
}
