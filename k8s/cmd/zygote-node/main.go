// zygote-node is the node agent: it runs beside one zygoted (the same pod of the
// DaemonSet), reconciles the Sandboxes placed on its node through the daemon's REST
// API, renews the node's Lease while the daemon answers and reports the node's
// capacity in its ZygoteNode.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	zv1 "zygote.dev/k8s/api/v1alpha1"
	"zygote.dev/k8s/internal/daemon"
	"zygote.dev/k8s/internal/node"
)

func main() {
	host, _ := os.Hostname()
	if v := os.Getenv("NODE_NAME"); v != "" {
		host = v
	}
	var (
		nodeName      = flag.String("node-name", host, "this node's name (default $NODE_NAME, else the hostname)")
		daemonURL     = flag.String("daemon-url", "http://127.0.0.1:7420", "the local zygoted")
		advertiseURL  = flag.String("advertise-url", "", "the daemon's URL for clients, in Sandbox endpoints (default --daemon-url)")
		stateDir      = flag.String("daemon-state-dir", "", "the daemon's state directory: its token is read from <dir>/token")
		tokenFile     = flag.String("daemon-token-file", "", "file holding the daemon's API token (instead of --daemon-state-dir)")
		namespace     = flag.String("namespace", "zygote-system", "namespace of the node Lease")
		leaseDuration = flag.Duration("lease-duration", 20*time.Second, "the node Lease's duration (renewed every quarter of it)")
		memoryMiB     = flag.Int64("memory-mib", 0, "guest memory offered to Sandboxes (0: 90% of MemTotal)")
		vcpus         = flag.Int("vcpus", 0, "guest vCPUs offered (0: the host's CPUs)")
		concurrent    = flag.Int("max-concurrent", 4, "VMs created at once")
		resync        = flag.Duration("resync", 15*time.Second, "how often a running Sandbox's VM is checked")
		statusEvery   = flag.Duration("status-interval", 5*time.Second, "how often the ZygoteNode status is refreshed")
		gcEvery       = flag.Duration("gc-interval", 30*time.Second, "how often VMs no Sandbox owns are looked for")
		probeAddr     = flag.String("health-probe-bind-address", "0", "address of /healthz and /readyz (0: off)")
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	logger := ctrl.Log.WithName("zygote-node").WithValues("node", *nodeName)
	fail := func(what string, err error) {
		logger.Error(err, what)
		os.Exit(1)
	}
	if *nodeName == "" {
		fail("flags", fmt.Errorf("--node-name is empty"))
	}
	token := ""
	var err error
	switch {
	case *tokenFile != "":
		var b []byte
		b, err = os.ReadFile(*tokenFile)
		token = strings.TrimSpace(string(b))
	case *stateDir != "":
		// The daemon writes its token on first start: wait for it.
		for i := 0; i < 120; i++ {
			if token, err = daemon.TokenFromStateDir(*stateDir); err == nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	default:
		err = fmt.Errorf("give --daemon-state-dir or --daemon-token-file")
	}
	if err != nil {
		fail("daemon token", err)
	}
	if *advertiseURL == "" {
		*advertiseURL = *daemonURL
	}
	dc := daemon.New(*daemonURL, token)

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = zv1.AddToScheme(scheme)
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: *probeAddr,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only this node's Sandboxes (spec.nodeName is a selectable field).
			&zv1.Sandbox{}:          {Field: fields.OneTermEqualSelector("spec.nodeName", *nodeName)},
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{*namespace: {}}},
			&zv1.ZygoteNode{}:       {Field: fields.OneTermEqualSelector("metadata.name", *nodeName)},
		}},
	})
	if err != nil {
		fail("manager", err)
	}
	agent := &node.Agent{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Daemon: dc,
		AdvertiseURL: strings.TrimRight(*advertiseURL, "/"), Node: *nodeName, Resync: *resync,
		MaxConcurrent: *concurrent}
	if err := agent.SetupWithManager(mgr); err != nil {
		fail("agent", err)
	}
	hb := &node.Heartbeat{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Daemon: dc,
		Node: *nodeName, Namespace: *namespace, LeaseDuration: *leaseDuration,
		AdvertiseURL:   agent.AdvertiseURL,
		Capacity:       zv1.NodeCapacity{MemoryMiB: *memoryMiB, VCPUs: int32(*vcpus)},
		StatusInterval: *statusEvery, GCInterval: *gcEvery}
	if err := mgr.Add(hb); err != nil {
		fail("heartbeat", err)
	}
	_ = mgr.AddHealthzCheck("healthz", healthz.Ping)
	_ = mgr.AddReadyzCheck("readyz", healthz.Ping)
	logger.Info("starting", "daemon", *daemonURL)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fail("run", err)
	}
}
