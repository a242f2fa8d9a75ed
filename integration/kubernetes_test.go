package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"

	"github.com/tierblk/tierblk/pkg/backend/registry"
)

func init() { toolPackages["dumpe2fs"] = "e2fsprogs" }

// kubeDir holds the driver's manifests (kubectl apply -k) and kubeExamples the examples.
const (
	kubeDir      = "../configs/kubernetes"
	kubeExamples = kubeDir + "/examples"
	// kubeNamespace is the namespace every namespaced object of the driver is in.
	kubeNamespace = "tierblk"
)

// The parts of Kubernetes objects that the manifests set and the tests check. Decoding them from
// the manifests' YAML is how the tests read what Kubernetes would.
type (
	k8sMeta struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Annotations map[string]string `yaml:"annotations"`
	}
	k8sObject struct {
		APIVersion string  `yaml:"apiVersion"`
		Kind       string  `yaml:"kind"`
		Metadata   k8sMeta `yaml:"metadata"`
		file       string
		node       yaml.Node
	}
	k8sCSIDriver struct {
		Spec struct {
			AttachRequired       *bool    `yaml:"attachRequired"`
			PodInfoOnMount       *bool    `yaml:"podInfoOnMount"`
			VolumeLifecycleModes []string `yaml:"volumeLifecycleModes"`
			FSGroupPolicy        string   `yaml:"fsGroupPolicy"`
		} `yaml:"spec"`
	}
	k8sStorageClass struct {
		Provisioner          string            `yaml:"provisioner"`
		Parameters           map[string]string `yaml:"parameters"`
		ReclaimPolicy        string            `yaml:"reclaimPolicy"`
		AllowVolumeExpansion *bool             `yaml:"allowVolumeExpansion"`
		VolumeBindingMode    string            `yaml:"volumeBindingMode"`
	}
	k8sWorkload struct { // a Deployment or a DaemonSet
		Spec struct {
			Replicas       *int `yaml:"replicas"`
			UpdateStrategy struct {
				Type string `yaml:"type"`
			} `yaml:"updateStrategy"`
			Template struct {
				Metadata k8sMeta    `yaml:"metadata"`
				Spec     k8sPodSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	k8sPod struct {
		Spec k8sPodSpec `yaml:"spec"`
	}
	k8sPodSpec struct {
		ServiceAccountName            string         `yaml:"serviceAccountName"`
		HostNetwork                   bool           `yaml:"hostNetwork"`
		TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
		Containers                    []k8sContainer `yaml:"containers"`
		Volumes                       []k8sVolume    `yaml:"volumes"`
	}
	k8sContainer struct {
		Name  string   `yaml:"name"`
		Image string   `yaml:"image"`
		Args  []string `yaml:"args"`
		Env   []k8sEnv `yaml:"env"`
		Ports []struct {
			ContainerPort int `yaml:"containerPort"`
		} `yaml:"ports"`
		VolumeMounts  []k8sMount `yaml:"volumeMounts"`
		VolumeDevices []struct {
			Name string `yaml:"name"`
		} `yaml:"volumeDevices"`
		SecurityContext struct {
			Privileged bool `yaml:"privileged"`
		} `yaml:"securityContext"`
	}
	k8sEnv struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	}
	k8sMount struct {
		Name             string `yaml:"name"`
		MountPath        string `yaml:"mountPath"`
		MountPropagation string `yaml:"mountPropagation"`
	}
	k8sVolume struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
		} `yaml:"hostPath"`
		NFS *struct {
			Server string `yaml:"server"`
			Path   string `yaml:"path"`
		} `yaml:"nfs"`
		EmptyDir              any `yaml:"emptyDir"`
		PersistentVolumeClaim *struct {
			ClaimName string `yaml:"claimName"`
		} `yaml:"persistentVolumeClaim"`
	}
	k8sPV struct {
		Spec struct {
			AccessModes      []string `yaml:"accessModes"`
			VolumeMode       string   `yaml:"volumeMode"`
			ReclaimPolicy    string   `yaml:"persistentVolumeReclaimPolicy"`
			StorageClassName *string  `yaml:"storageClassName"`
			CSI              struct {
				Driver           string            `yaml:"driver"`
				VolumeHandle     string            `yaml:"volumeHandle"`
				FSType           string            `yaml:"fsType"`
				VolumeAttributes map[string]string `yaml:"volumeAttributes"`
			} `yaml:"csi"`
		} `yaml:"spec"`
	}
	k8sPVC struct {
		Spec struct {
			StorageClassName *string  `yaml:"storageClassName"`
			VolumeMode       string   `yaml:"volumeMode"`
			VolumeName       string   `yaml:"volumeName"`
			AccessModes      []string `yaml:"accessModes"`
		} `yaml:"spec"`
	}
	k8sRoleBinding struct {
		Subjects []struct {
			Kind      string `yaml:"kind"`
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"subjects"`
		RoleRef struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"roleRef"`
	}
	k8sKustomization struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name    string `yaml:"name"`
			NewName string `yaml:"newName"`
			NewTag  string `yaml:"newTag"`
		} `yaml:"images"`
	}
)

// readManifests reads every YAML document of the *.yaml files in dir (not below it).
func readManifests(t *testing.T, dir string) []*k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no manifests in %s", dir)
	var objs []*k8sObject
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			o := &k8sObject{file: filepath.Base(file)}
			if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
				break
			} else {
				require.NoError(t, err, "%s", file)
			}
			require.NoError(t, o.node.Decode(o), "%s", file)
			require.NotEmpty(t, o.Kind, "%s: a document without a kind", file)
			objs = append(objs, o)
		}
	}
	return objs
}

// decode decodes o as v.
func (o *k8sObject) decode(t *testing.T, v any) {
	t.Helper()
	require.NoError(t, o.node.Decode(v), "%s %s in %s", o.Kind, o.Metadata.Name, o.file)
}

// find returns the one object of kind (and name, when not "") among objs.
func find(t *testing.T, objs []*k8sObject, kind, name string) *k8sObject {
	t.Helper()
	var found []*k8sObject
	for _, o := range objs {
		if o.Kind == kind && (name == "" || o.Metadata.Name == name) {
			found = append(found, o)
		}
	}
	require.Len(t, found, 1, "objects of kind %s named %q", kind, name)
	return found[0]
}

// container returns the pod's container called name.
func (s *k8sPodSpec) container(t *testing.T, name string) *k8sContainer {
	t.Helper()
	i := slices.IndexFunc(s.Containers, func(c k8sContainer) bool { return c.Name == name })
	require.GreaterOrEqual(t, i, 0, "a container named %s", name)
	return &s.Containers[i]
}

// volumeAt returns the pod's volume that container c mounts at dir or above it, and the path of
// dir inside that volume.
func (s *k8sPodSpec) volumeAt(t *testing.T, c *k8sContainer, dir string) (*k8sVolume, string) {
	t.Helper()
	best := -1
	for i, m := range c.VolumeMounts {
		if (dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")) &&
			(best < 0 || len(m.MountPath) > len(c.VolumeMounts[best].MountPath)) {
			best = i
		}
	}
	require.GreaterOrEqual(t, best, 0, "container %s mounts no volume at %s", c.Name, dir)
	m := c.VolumeMounts[best]
	i := slices.IndexFunc(s.Volumes, func(v k8sVolume) bool { return v.Name == m.Name })
	require.GreaterOrEqual(t, i, 0, "container %s mounts volume %s, which the pod lacks", c.Name, m.Name)
	return &s.Volumes[i], strings.TrimPrefix(dir, m.MountPath)
}

// flagArg returns the value of --name in args (--name=VALUE), and whether it is there at all.
func flagArg(args []string, name string) (string, bool) {
	for _, a := range args {
		if a == "--"+name {
			return "", true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// csiConn is a gRPC connection to a CSI driver's unix socket.
func csiConn(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// mountCapability asks for a file system volume of fsType on one node, as a PVC of
// accessModes [ReadWriteOnce] does; blockCapability for a raw block one.
func mountCapability(fsType string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCapability() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// provisionerParameters are the parameters the external-provisioner passes CreateVolume for a PVC
// of a class with params: the class's, and with --extra-create-metadata the PVC's and PV's names.
func provisionerParameters(params map[string]string, pvName string) map[string]string {
	p := map[string]string{
		"csi.storage.k8s.io/pv/name":       pvName,
		"csi.storage.k8s.io/pvc/name":      "data",
		"csi.storage.k8s.io/pvc/namespace": "default",
	}
	for k, v := range params {
		p[k] = v
	}
	return p
}

// hostArgs are a container's args with the directories it mounts replaced by directories of the
// host, as dirs maps them (mount path to host path), and each $(VAR) by env's VAR, as Kubernetes
// expands it.
func hostArgs(args []string, dirs, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		a = regexp.MustCompile(`\$\([A-Za-z_][A-Za-z0-9_]*\)`).ReplaceAllStringFunc(a, func(v string) string {
			if value, ok := env[v[2:len(v)-1]]; ok {
				return value
			}
			return v // Kubernetes leaves an unknown variable as it is
		})
		prefix, value := "", a
		if j := strings.Index(a, "="); strings.HasPrefix(a, "--") && j > 0 {
			prefix, value = a[:j+1], a[j+1:]
		}
		if v, ok := strings.CutPrefix(value, "unix://"); ok {
			prefix, value = prefix+"unix://", v
		} else if v, ok := strings.CutPrefix(value, "unix:"); ok {
			prefix, value = prefix+"unix:", v
		}
		best := ""
		for from := range dirs {
			if (value == from || strings.HasPrefix(value, from+"/")) && len(from) > len(best) {
				best = from
			}
		}
		if best != "" {
			value = dirs[best] + strings.TrimPrefix(value, best)
		}
		out[i] = prefix + value
	}
	return out
}

// hostDirs makes a temporary directory of the host for each of c's mounts, for hostArgs.
func hostDirs(t *testing.T, c *k8sContainer) map[string]string {
	t.Helper()
	tmp := shortTempDir(t)
	dirs := map[string]string{}
	for _, m := range c.VolumeMounts {
		dirs[m.MountPath] = filepath.Join(tmp, m.Name)
		require.NoError(t, os.Mkdir(dirs[m.MountPath], 0o755))
	}
	return dirs
}

// csiFlags are the flags `tierblk csi --help` lists.
func csiFlags(t *testing.T) []string {
	t.Helper()
	help := mustRunTool(t, tierblkPath, "csi", "--help")
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		flags = append(flags, m[1])
	}
	require.Contains(t, flags, "endpoint", "the flags of tierblk csi --help:\n%s", help)
	return flags
}

// requireKnownFlags requires that every flag in a tierblk container's args is one of `tierblk csi`'s.
func requireKnownFlags(t *testing.T, c *k8sContainer, known []string) {
	t.Helper()
	require.Equal(t, "csi", c.Args[0], "container %s runs tierblk csi", c.Name)
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, strings.HasPrefix(a, "--"), "container %s: argument %q is not a --flag=value", c.Name, a)
		require.Contains(t, known, name, "container %s: tierblk csi has no flag --%s", c.Name, name)
	}
}

// TestKubernetesManifests reads configs/kubernetes/ as Kubernetes would and checks what can drift
// from the driver and between the files: kubectl apply -k takes every manifest, every namespaced
// object is in the driver's namespace, roles are bound to accounts that exist, and the workloads
// run as those accounts; the tierblk containers' flags are `tierblk csi`'s; the controller and
// the node plugin mount the same NAS share at the --backing-dir they give; the node plugin keeps
// --state-dir and --cache-dir on the host, shares its socket with the kubelet where the
// registrar says, and serves metrics where Prometheus is told to scrape. Then it runs the
// controller's own command line on this host (its mounts as temporary directories) and asks it,
// through CSI, what the manifests take for granted: its name is the CSIDriver's, the
// StorageClass's provisioner and the registrar's directory; it has what the sidecars call
// (create and delete, expand, no ControllerPublish since attachRequired is false); it accepts the
// StorageClass's parameters as the external-provisioner passes them, gives the PV's name to the
// nodes and makes, grows and deletes the volume's file in the backing directory; and the examples'
// static PV's handle and attributes are ones it takes.
func TestKubernetesManifests(t *testing.T) {
	objs := readManifests(t, kubeDir)

	// kubectl apply -k: the kustomization lists every manifest of the directory, and only those.
	var k k8sKustomization
	raw, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &k))
	var files []string
	for _, o := range objs {
		if o.Kind != "Kustomization" && !slices.Contains(files, o.file) {
			files = append(files, o.file)
		}
	}
	slices.Sort(files)
	require.ElementsMatch(t, files, k.Resources, "kustomization.yaml's resources: every manifest in %s", kubeDir)

	// Each kind at the API version Kubernetes serves it (a wrong one is refused by kubectl apply).
	apiVersions := map[string]string{
		"Namespace": "v1", "ServiceAccount": "v1", "CSIDriver": "storage.k8s.io/v1", "StorageClass": "storage.k8s.io/v1",
		"ClusterRole": "rbac.authorization.k8s.io/v1", "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
		"Role": "rbac.authorization.k8s.io/v1", "RoleBinding": "rbac.authorization.k8s.io/v1",
		"Deployment": "apps/v1", "DaemonSet": "apps/v1", "Kustomization": "kustomize.config.k8s.io/v1beta1",
		"PersistentVolume": "v1", "PersistentVolumeClaim": "v1", "Pod": "v1",
	}
	for _, o := range append(slices.Clone(objs), readManifests(t, kubeExamples)...) {
		want, ok := apiVersions[o.Kind]
		require.True(t, ok, "%s: kind %s, which the test does not know", o.file, o.Kind)
		require.Equal(t, want, o.APIVersion, "%s: the apiVersion of %s %s", o.file, o.Kind, o.Metadata.Name)
	}

	// Namespaces, accounts and roles.
	find(t, objs, "Namespace", kubeNamespace)
	for _, o := range objs {
		switch o.Kind {
		case "ServiceAccount", "Role", "RoleBinding", "Deployment", "DaemonSet":
			require.Equal(t, kubeNamespace, o.Metadata.Namespace, "the namespace of %s %s", o.Kind, o.Metadata.Name)
		}
		if o.Kind == "ClusterRoleBinding" || o.Kind == "RoleBinding" {
			var b k8sRoleBinding
			o.decode(t, &b)
			find(t, objs, b.RoleRef.Kind, b.RoleRef.Name)
			for _, s := range b.Subjects {
				require.Equal(t, "ServiceAccount", s.Kind)
				require.Equal(t, kubeNamespace, s.Namespace, "%s %s: its subject's namespace", o.Kind, o.Metadata.Name)
				find(t, objs, "ServiceAccount", s.Name)
			}
		}
	}

	var driver k8sCSIDriver
	driverObj := find(t, objs, "CSIDriver", "")
	driverObj.decode(t, &driver)
	require.NotNil(t, driver.Spec.AttachRequired)
	require.False(t, *driver.Spec.AttachRequired, "attachRequired: no external-attacher is deployed")
	require.Equal(t, []string{"Persistent"}, driver.Spec.VolumeLifecycleModes)
	require.Equal(t, "File", driver.Spec.FSGroupPolicy)

	var sc k8sStorageClass
	scObj := find(t, objs, "StorageClass", "tierblk-writeback")
	scObj.decode(t, &sc)
	require.Equal(t, "writeback", sc.Parameters["mode"])
	require.Equal(t, "Delete", sc.ReclaimPolicy)
	require.Equal(t, "WaitForFirstConsumer", sc.VolumeBindingMode)
	require.NotNil(t, sc.AllowVolumeExpansion)
	require.True(t, *sc.AllowVolumeExpansion)

	var controller, node k8sWorkload
	find(t, objs, "Deployment", "tierblk-csi-controller").decode(t, &controller)
	find(t, objs, "DaemonSet", "tierblk-csi-node").decode(t, &node)
	cs, ns := &controller.Spec.Template.Spec, &node.Spec.Template.Spec
	require.NotNil(t, controller.Spec.Replicas)
	require.Equal(t, 1, *controller.Spec.Replicas)
	find(t, objs, "ServiceAccount", cs.ServiceAccountName)
	find(t, objs, "ServiceAccount", ns.ServiceAccountName)

	// Every image: the driver's is the one kustomization.yaml renames; the sidecars' are the
	// Kubernetes project's, at a fixed version.
	ctb, ntb := cs.container(t, "tierblk"), ns.container(t, "tierblk")
	require.Len(t, k.Images, 1)
	require.Equal(t, k.Images[0].Name, ctb.Image, "the controller's image, as kustomization.yaml names it")
	require.Equal(t, k.Images[0].Name, ntb.Image, "the node plugin's image, as kustomization.yaml names it")
	for _, c := range append(slices.Clone(cs.Containers), ns.Containers...) {
		if c.Name != "tierblk" {
			require.Regexp(t, `^registry\.k8s\.io/sig-storage/[a-z-]+:v\d+\.\d+\.\d+$`, c.Image, "container %s", c.Name)
		}
	}

	known := csiFlags(t)
	requireKnownFlags(t, ctb, known)
	requireKnownFlags(t, ntb, known)
	_, ok := flagArg(ctb.Args, "controller")
	require.True(t, ok, "the Deployment runs the controller service")
	_, ok = flagArg(ntb.Args, "node")
	require.True(t, ok, "the DaemonSet runs the node service")

	// The CSI socket, shared with the sidecars through one volume.
	sockPath := func(c *k8sContainer) string {
		e, ok := flagArg(c.Args, "endpoint")
		require.True(t, ok, "container %s: --endpoint", c.Name)
		return strings.TrimPrefix(e, "unix://")
	}
	requireSidecarSocket := func(spec *k8sPodSpec, name, driverSock string) {
		side := spec.container(t, name)
		addr, ok := flagArg(side.Args, "csi-address")
		require.True(t, ok, "%s: --csi-address", name)
		dv, drel := spec.volumeAt(t, spec.container(t, "tierblk"), driverSock)
		sv, srel := spec.volumeAt(t, side, addr)
		require.Equal(t, dv.Name, sv.Name, "%s reaches the driver's socket through the same volume", name)
		require.Equal(t, drel, srel, "%s's --csi-address is the driver's socket", name)
	}
	ctrlSock, nodeSock := sockPath(ctb), sockPath(ntb)
	requireSidecarSocket(cs, "csi-provisioner", ctrlSock)
	requireSidecarSocket(cs, "csi-resizer", ctrlSock)
	requireSidecarSocket(ns, "node-driver-registrar", nodeSock)
	prov := cs.container(t, "csi-provisioner")
	_, ok = flagArg(prov.Args, "extra-create-metadata")
	require.True(t, ok, "the provisioner passes the PV's name to CreateVolume: the nodes label metrics with it")
	sweep, _ := flagArg(prov.Args, "snapshot-orphan-sweep-interval")
	require.Equal(t, "0", sweep, "no sweep of snapshots' finalizers: rbac.yaml grants no VolumeSnapshot rights")
	_, ok = flagArg(prov.Args, "leader-election")
	require.True(t, ok, "the provisioner elects a leader (a rolling update runs two controller pods)")
	find(t, objs, "Role", "tierblk-csi-leader-election")

	// The node's socket is in the kubelet's plugin directory, which the registrar tells the kubelet.
	sv, rel := ns.volumeAt(t, ntb, nodeSock)
	require.NotNil(t, sv.HostPath, "the node plugin's socket is on the host, for the kubelet")
	reg := ns.container(t, "node-driver-registrar")
	regPath, _ := flagArg(reg.Args, "kubelet-registration-path")
	require.Equal(t, sv.HostPath.Path+rel, regPath, "the registrar's --kubelet-registration-path is the socket as the host sees it")
	rv, _ := ns.volumeAt(t, reg, "/registration")
	require.NotNil(t, rv.HostPath)
	require.Equal(t, "/var/lib/kubelet/plugins_registry", rv.HostPath.Path)

	// The NAS share: the same NFS export at the same --backing-dir in both.
	cBacking, ok := flagArg(ctb.Args, "backing-dir")
	require.True(t, ok, "the controller's --backing-dir")
	nBacking, ok := flagArg(ntb.Args, "backing-dir")
	require.True(t, ok, "the node plugin's --backing-dir")
	require.Equal(t, cBacking, nBacking, "the controller and the nodes see dynamic volumes' files at the same path")
	cv, crel := cs.volumeAt(t, ctb, cBacking)
	nv, nrel := ns.volumeAt(t, ntb, nBacking)
	require.NotNil(t, cv.NFS, "the controller's backing directory is the NAS share")
	require.NotNil(t, nv.NFS, "the node plugin's backing directory is the NAS share")
	require.Equal(t, *cv.NFS, *nv.NFS, "the same NFS export in controller.yaml and node.yaml")
	require.Equal(t, crel, nrel)

	// The node plugin: what must outlive it on the host, devices, mounts and metrics.
	for _, f := range []string{"state-dir", "cache-dir"} {
		dir, ok := flagArg(ntb.Args, f)
		require.True(t, ok, "the node plugin's --%s", f)
		v, rel := ns.volumeAt(t, ntb, dir)
		require.NotNil(t, v.HostPath, "--%s %s is a directory of the host, to outlive the pod", f, dir)
		require.Empty(t, rel, "--%s is the host directory's mount", f)
	}
	nodeID, _ := flagArg(ntb.Args, "node-id")
	require.Equal(t, "$(NODE_NAME)", nodeID)
	require.True(t, slices.ContainsFunc(ntb.Env, func(e k8sEnv) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}), "NODE_NAME is the node's name, as Kubernetes knows it")
	require.True(t, ntb.SecurityContext.Privileged, "the node plugin makes devices and mounts")
	kv, _ := ns.volumeAt(t, ntb, "/var/lib/kubelet/pods")
	require.NotNil(t, kv.HostPath)
	require.Equal(t, "/var/lib/kubelet", kv.HostPath.Path)
	i := slices.IndexFunc(ntb.VolumeMounts, func(m k8sMount) bool { return m.Name == kv.Name })
	require.Equal(t, "Bidirectional", ntb.VolumeMounts[i].MountPropagation, "mounts of staged volumes reach the kubelet")
	dv, _ := ns.volumeAt(t, ntb, "/dev/ublkb0")
	require.NotNil(t, dv.HostPath, "devices made after the start appear in the container")
	require.Equal(t, "/dev", dv.HostPath.Path)
	metricsAddr, ok := flagArg(ntb.Args, "metrics")
	require.True(t, ok, "the node plugin serves metrics")
	_, port, ok := strings.Cut(metricsAddr, ":")
	require.True(t, ok)
	require.Equal(t, port, node.Spec.Template.Metadata.Annotations["prometheus.io/port"], "Prometheus scrapes the metrics port")
	admin, ok := flagArg(ntb.Args, "admin")
	require.True(t, ok, "the node plugin serves its admin endpoint, for tierblk stats and flush in the pod")
	require.True(t, strings.HasPrefix(admin, "unix:/csi/"), "the admin endpoint (%s) is a unix socket in the plugin's directory: it has no authentication", admin)
	require.Equal(t, "true", node.Spec.Template.Metadata.Annotations["prometheus.io/scrape"])
	require.Len(t, ntb.Ports, 1)
	require.Equal(t, port, strconv.Itoa(ntb.Ports[0].ContainerPort), "the metrics port is the container's port")
	require.Equal(t, "RollingUpdate", node.Spec.UpdateStrategy.Type)
	require.NotNil(t, ns.TerminationGracePeriodSeconds)
	require.GreaterOrEqual(t, *ns.TerminationGracePeriodSeconds, 60, "time for the plugin to stop cleanly")

	// The controller's command line on this host, each mount a temporary directory.
	dirs := hostDirs(t, ctb)
	sock := hostArgs([]string{ctrlSock}, dirs, nil)[0]
	startDaemon(t, tierblkPath, hostArgs(ctb.Args, dirs, nil), "unix:"+sock)
	conn := csiConn(t, sock)
	backing := hostArgs([]string{cBacking}, dirs, nil)[0]
	requireDriverTakesManifests(t, conn, objs, backing)

	// The examples: their claims and pods fit the class and the driver.
	examples := readManifests(t, kubeExamples)
	pvcs := map[string]k8sPVC{}
	for _, o := range examples {
		if o.Kind == "PersistentVolumeClaim" {
			var c k8sPVC
			o.decode(t, &c)
			pvcs[o.Metadata.Name] = c
			require.Equal(t, []string{"ReadWriteOnce"}, c.Spec.AccessModes, "claim %s: one node at a time", o.Metadata.Name)
			require.NotNil(t, c.Spec.StorageClassName, "claim %s names its class (\"\" for a static PV)", o.Metadata.Name)
			if *c.Spec.StorageClassName == "" {
				find(t, examples, "PersistentVolume", c.Spec.VolumeName)
			} else {
				require.Equal(t, scObj.Metadata.Name, *c.Spec.StorageClassName)
			}
		}
	}
	var block, fs int
	for _, o := range examples {
		if o.Kind != "Pod" {
			continue
		}
		var p k8sPod
		o.decode(t, &p)
		for _, v := range p.Spec.Volumes {
			c, ok := pvcs[v.PersistentVolumeClaim.ClaimName]
			require.True(t, ok, "pod %s: claim %s is in the examples", o.Metadata.Name, v.PersistentVolumeClaim.ClaimName)
			var mounted, device bool
			for _, ct := range p.Spec.Containers {
				for _, m := range ct.VolumeMounts {
					mounted = mounted || m.Name == v.Name
				}
				for _, d := range ct.VolumeDevices {
					device = device || d.Name == v.Name
				}
			}
			if c.Spec.VolumeMode == "Block" {
				require.True(t, device && !mounted, "pod %s: a block claim is a volumeDevice", o.Metadata.Name)
				block++
			} else {
				require.True(t, mounted && !device, "pod %s: a file system claim is a volumeMount", o.Metadata.Name)
				fs++
			}
		}
	}
	require.Equal(t, 1, block, "pods of the examples with a raw block volume")
	require.Equal(t, 1, fs, "pods of the examples with a file system volume")

	var pv k8sPV
	pvObj := find(t, examples, "PersistentVolume", "")
	pvObj.decode(t, &pv)
	require.Equal(t, "Retain", pv.Spec.ReclaimPolicy, "a static PV's disk is the user's")
	requireStaticPVTaken(t, conn, pv)
}

// requireDriverTakesManifests asks the controller listening on conn, whose --backing-dir is
// backing here, what the manifests objs rely on.
func requireDriverTakesManifests(t *testing.T, conn *grpc.ClientConn, objs []*k8sObject, backing string) {
	t.Helper()
	ctx := context.Background()
	ident, ctrl := csipb.NewIdentityClient(conn), csipb.NewControllerClient(conn)
	info, err := ident.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	require.NoError(t, err)
	name := info.GetName()
	require.Equal(t, name, find(t, objs, "CSIDriver", "").Metadata.Name, "the CSIDriver's name is the driver's")
	var sc k8sStorageClass
	scObj := find(t, objs, "StorageClass", "")
	scObj.decode(t, &sc)
	require.Equal(t, name, sc.Provisioner, "the StorageClass's provisioner is the driver")
	var node k8sWorkload
	find(t, objs, "DaemonSet", "").decode(t, &node)
	reg := node.Spec.Template.Spec.container(t, "node-driver-registrar")
	regPath, _ := flagArg(reg.Args, "kubelet-registration-path")
	require.Equal(t, "/var/lib/kubelet/plugins/"+name+"/csi.sock", regPath, "the kubelet's directory for the driver's socket")

	pcaps, err := ident.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
	require.NoError(t, err)
	var controllerService, offline bool
	for _, c := range pcaps.GetCapabilities() {
		controllerService = controllerService || c.GetService().GetType() == csipb.PluginCapability_Service_CONTROLLER_SERVICE
		offline = offline || c.GetVolumeExpansion().GetType() == csipb.PluginCapability_VolumeExpansion_OFFLINE
	}
	require.True(t, controllerService, "the controller's sidecars need its CONTROLLER_SERVICE")
	require.True(t, offline, "allowVolumeExpansion: the driver grows volumes (offline)")
	ccaps, err := ctrl.ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
	require.NoError(t, err)
	var rpcs []csipb.ControllerServiceCapability_RPC_Type
	for _, c := range ccaps.GetCapabilities() {
		rpcs = append(rpcs, c.GetRpc().GetType())
	}
	require.Contains(t, rpcs, csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, "the csi-provisioner's calls")
	require.Contains(t, rpcs, csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME, "the csi-resizer's calls")
	require.NotContains(t, rpcs, csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME, "attachRequired: false")

	// A PVC of the class, as the external-provisioner asks for it: a file system, then a block volume.
	for _, vc := range []*csipb.VolumeCapability{mountCapability(""), blockCapability()} {
		pvName := "pvc-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		created, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
			Name:               pvName,
			CapacityRange:      &csipb.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csipb.VolumeCapability{vc},
			Parameters:         provisionerParameters(sc.Parameters, pvName),
		})
		require.NoError(t, err, "CreateVolume with the StorageClass's parameters %v", sc.Parameters)
		vol := created.GetVolume()
		file := filepath.Join(backing, vol.GetVolumeId()+".img")
		fi, err := os.Stat(file)
		require.NoError(t, err, "the volume's file in the backing directory")
		require.Equal(t, int64(64<<20), fi.Size())
		vctx := vol.GetVolumeContext()
		require.Equal(t, "file://"+file, vctx["backend"], "the nodes open the file at the same --backing-dir")
		require.Equal(t, pvName, vctx["pvName"], "the nodes label the volume's metrics with the PV's name")
		for k, v := range sc.Parameters {
			require.Equal(t, v, vctx[k], "the StorageClass's %s reaches the nodes", k)
		}

		grown, err := ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{
			VolumeId: vol.GetVolumeId(), CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: vc,
		})
		require.NoError(t, err)
		require.Equal(t, int64(128<<20), grown.GetCapacityBytes())
		require.Equal(t, vc.GetMount() != nil, grown.GetNodeExpansionRequired(), "a file system grows on the node")
		fi, err = os.Stat(file)
		require.NoError(t, err)
		require.Equal(t, int64(128<<20), fi.Size(), "the grown file")

		_, err = ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
		require.NoError(t, err)
		_, err = os.Stat(file)
		require.ErrorIs(t, err, os.ErrNotExist, "reclaimPolicy Delete: the file is gone")
	}
}

// requireStaticPVTaken checks a static PV against the driver: its handle is one the driver uses
// as an ID as it is (CreateVolume of that name gives that ID), its cache settings are ones a
// StorageClass could give, and its backend's scheme is one tierblk opens.
func requireStaticPVTaken(t *testing.T, conn *grpc.ClientConn, pv k8sPV) {
	t.Helper()
	ctx := context.Background()
	ctrl := csipb.NewControllerClient(conn)
	attrs := map[string]string{}
	for k, v := range pv.Spec.CSI.VolumeAttributes {
		if k != "backend" {
			attrs[k] = v
		}
	}
	vc := mountCapability(pv.Spec.CSI.FSType)
	if pv.Spec.VolumeMode == "Block" {
		vc = blockCapability()
	}
	created, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name: pv.Spec.CSI.VolumeHandle, VolumeCapabilities: []*csipb.VolumeCapability{vc}, Parameters: attrs,
	})
	require.NoError(t, err, "the static PV's attributes and fsType %q", pv.Spec.CSI.FSType)
	require.Equal(t, pv.Spec.CSI.VolumeHandle, created.GetVolume().GetVolumeId(), "the static PV's volumeHandle is a valid volume ID")
	_, err = ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: created.GetVolume().GetVolumeId()})
	require.NoError(t, err)
	backend := pv.Spec.CSI.VolumeAttributes["backend"]
	scheme, _, ok := strings.Cut(backend, "://")
	require.True(t, ok, "the static PV's backend %q is a URL", backend)
	require.Contains(t, registry.Default().Schemes(), scheme, "the static PV's backend")
}

// TestKubernetesNodePlugin runs the DaemonSet's tierblk command line on this host, as the kubelet
// would start it on a node with nothing staged: its mounts are temporary directories, NODE_NAME
// is the node's name, and its metrics endpoint, on the same kind of address, has a free port. The
// plugin must serve its socket, name itself by NODE_NAME (NodeGetInfo), serve /metrics to a
// scrape that names the pod's address, as Prometheus's Kubernetes discovery makes it, and its
// admin endpoint to tierblk stats. Staging a volume needs the kernel's ublk or NBD devices: the
// VM's tests do that.
func TestKubernetesNodePlugin(t *testing.T) {
	var node k8sWorkload
	find(t, readManifests(t, kubeDir), "DaemonSet", "tierblk-csi-node").decode(t, &node)
	c := node.Spec.Template.Spec.container(t, "tierblk")
	dirs := hostDirs(t, c)
	const nodeName = "node-1"
	args := hostArgs(c.Args, dirs, map[string]string{"NODE_NAME": nodeName})
	port := strings.TrimPrefix(freeTCPAddr(t), "127.0.0.1:")
	for i, a := range args {
		if addr, ok := strings.CutPrefix(a, "--metrics="); ok {
			host, _, ok := strings.Cut(addr, ":")
			require.True(t, ok, "--metrics %s: HOST:PORT", addr)
			args[i] = "--metrics=" + host + ":" + port
		}
	}
	e, _ := flagArg(c.Args, "endpoint")
	sock := hostArgs([]string{strings.TrimPrefix(e, "unix://")}, dirs, nil)[0]
	startDaemon(t, tierblkPath, args, "unix:"+sock, "127.0.0.1:"+port)

	info, err := csipb.NewNodeClient(csiConn(t, sock)).NodeGetInfo(context.Background(), &csipb.NodeGetInfoRequest{})
	require.NoError(t, err)
	require.Equal(t, nodeName, info.GetNodeId(), "the node plugin's --node-id is the node's name")

	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/metrics", nil)
	require.NoError(t, err)
	req.Host = "10.0.0.7:" + port // the pod's address (the node's, on the host's network)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "a scrape of the pod's address: %s", body)
	require.Contains(t, string(body), "# TYPE ", "Prometheus metrics")

	admin, _ := flagArg(c.Args, "admin")
	out, err := exec.Command(tierblkPath, "stats", "--admin", hostArgs([]string{admin}, dirs, nil)[0]).CombinedOutput()
	require.NoError(t, err, "tierblk stats through the node plugin's admin endpoint:\n%s", out)
}

// TestCSISanityController runs csi-sanity (the Kubernetes project's conformance tests of a CSI
// driver) against `tierblk csi --controller --node` on this host, for the Identity and Controller
// services, with the StorageClass's parameters as the volumes' parameters. The Node service's
// tests need the kernel's ublk or NBD devices and run in the VM.
func TestCSISanityController(t *testing.T) {
	tmp := shortTempDir(t)
	sanity := filepath.Join(tmp, "csi-sanity")
	build := exec.Command("go", "build", "-o", sanity, "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity")
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building csi-sanity:\n%s", out)

	var sc k8sStorageClass
	find(t, readManifests(t, kubeDir), "StorageClass", "tierblk-writeback").decode(t, &sc)
	params, err := yaml.Marshal(sc.Parameters)
	require.NoError(t, err)
	paramsFile := filepath.Join(tmp, "parameters.yaml")
	require.NoError(t, os.WriteFile(paramsFile, params, 0o644))

	dirs := map[string]string{}
	for _, d := range []string{"backing", "state", "cache", "mnt", "staging"} {
		dirs[d] = filepath.Join(tmp, d)
		require.NoError(t, os.Mkdir(dirs[d], 0o755))
	}
	sock := filepath.Join(tmp, "csi.sock")
	startDaemon(t, tierblkPath, []string{"csi", "--controller", "--node", "--node-id", "sanity",
		"--backing-dir", dirs["backing"], "--state-dir", dirs["state"], "--cache-dir", dirs["cache"],
		"--endpoint", "unix://" + sock}, "unix:"+sock)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sanity, "--csi.endpoint", "unix://"+sock,
		"--csi.mountdir", filepath.Join(dirs["mnt"], "target"), "--csi.stagingdir", filepath.Join(dirs["staging"], "staging"),
		"--csi.testvolumeparameters", paramsFile, "--csi.testvolumesize", strconv.Itoa(64<<20),
		"--csi.testvolumeexpandsize", strconv.Itoa(128<<20),
		"--ginkgo.skip", `Node Service`, "--ginkgo.no-color")
	out, err = cmd.CombinedOutput()
	summary := regexp.MustCompile(`(?m)^Ran \d+ of \d+ Specs.*$|^(SUCCESS|FAIL)!.*$`).FindAllString(string(out), -1)
	t.Logf("csi-sanity: %s", strings.Join(summary, "; "))
	require.NoError(t, err, "csi-sanity:\n%s", out)
	require.Regexp(t, `Ran [1-9]\d* of`, string(out), "csi-sanity ran no test")
	left, err := filepath.Glob(filepath.Join(dirs["backing"], "*"))
	require.NoError(t, err)
	require.Empty(t, left, "volumes csi-sanity deleted are gone from the backing directory")
}

// TestContainerImageCSI builds the CSI driver's image with `make image-csi` and runs in it what
// the manifests need: tierblk itself, the file system tools the node plugin runs (each makes or
// grows a file system in a file of the host, which the host's tools then read), and the
// controller's container from configs/kubernetes/controller.yaml with its security context,
// answering CreateVolume with the StorageClass's parameters through its socket.
func TestContainerImageCSI(t *testing.T) {
	requireTools(t, "make", "dumpe2fs")
	tmp := shortTempDir(t)
	p := newPodman(t, tmp)
	image := fmt.Sprintf("localhost/tierblk-csi-test-%d", os.Getpid())
	ref, version := p.buildImage(t, tmp, "image-csi", "CSI_IMAGE", "CSI_IMAGE_CONTEXT", image)

	require.Empty(t, strings.TrimSpace(p.run("image", "inspect", "--format", "{{.Config.User}}", ref)), "the image runs as root")
	run := func(args ...string) string {
		t.Helper()
		return p.run(append(append([]string{}, containerRun...), args...)...)
	}
	require.Contains(t, run("--rm", ref, "version"), "tierblk "+version+" ")

	// The tools, by the names the node plugin runs them (on the image's PATH), on files of the host.
	work := filepath.Join(tmp, "work")
	require.NoError(t, os.Mkdir(work, 0o755))
	tool := func(name string, args ...string) string {
		t.Helper()
		return run(append([]string{"--rm", "-v", work + ":/work", "--entrypoint", name, ref}, args...)...)
	}
	ext4 := filepath.Join(work, "ext4.img")
	require.NoError(t, os.WriteFile(ext4, nil, 0o644))
	require.NoError(t, os.Truncate(ext4, 64<<20))
	tool("mkfs.ext4", "-F", "-q", "/work/ext4.img")
	blocks := func() int64 {
		t.Helper()
		m := regexp.MustCompile(`(?m)^Block count:\s+(\d+)$`).FindStringSubmatch(mustRunTool(t, "dumpe2fs", "-h", ext4))
		require.NotNil(t, m, "dumpe2fs -h %s: the image's mkfs.ext4 made an ext4 file system", ext4)
		n, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		return n
	}
	before := blocks()
	require.NoError(t, os.Truncate(ext4, 128<<20))
	tool("resize2fs", "/work/ext4.img")
	require.Equal(t, 2*before, blocks(), "resize2fs in the image grew the file system to the file's size")
	for _, fs := range []string{"ext3", "ext2"} {
		require.Contains(t, tool("mkfs."+fs, "-V"), "mke2fs", "mkfs.%s", fs)
	}

	xfs := filepath.Join(work, "xfs.img")
	require.NoError(t, os.WriteFile(xfs, nil, 0o644))
	require.NoError(t, os.Truncate(xfs, 512<<20)) // above mkfs.xfs's smallest file system, 300 MB
	tool("mkfs.xfs", "-f", "-q", "/work/xfs.img")
	f, err := os.Open(xfs)
	require.NoError(t, err)
	magic := make([]byte, 4)
	_, err = f.ReadAt(magic, 0)
	f.Close()
	require.NoError(t, err)
	require.Equal(t, "XFSB", string(magic), "the image's mkfs.xfs made an XFS file system")
	require.Contains(t, tool("xfs_growfs", "-V"), "xfs_growfs version", "xfs_growfs runs in the image (it grows only a mounted XFS)")

	// The controller's container as controller.yaml runs it: root, no capabilities, a read-only
	// root file system, its socket directory and the NAS share as directories of the host.
	var controller k8sWorkload
	find(t, readManifests(t, kubeDir), "Deployment", "tierblk-csi-controller").decode(t, &controller)
	c := controller.Spec.Template.Spec.container(t, "tierblk")
	runArgs := []string{"--detach", "--user", "0", "--cap-drop", "ALL", "--read-only", "--security-opt", "no-new-privileges"}
	var sockDir, backing string
	for _, m := range c.VolumeMounts {
		dir := filepath.Join(tmp, m.Name)
		require.NoError(t, os.Mkdir(dir, 0o755))
		runArgs = append(runArgs, "-v", dir+":"+m.MountPath)
		switch m.Name {
		case "socket-dir":
			sockDir = dir
		case "backing":
			backing = dir
		}
	}
	name := filepath.Base(image) + "-controller"
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := p.try("logs", name)
			t.Logf("container %s's log:\n%s", name, logs)
		}
		_, _ = p.try("rm", "--force", name)
	})
	run(append(append(runArgs, "--name", name, ref), c.Args...)...)
	sock := filepath.Join(sockDir, "csi.sock")
	waitSocket(t, sock)
	var sc k8sStorageClass
	find(t, readManifests(t, kubeDir), "StorageClass", "tierblk-writeback").decode(t, &sc)
	created, err := csipb.NewControllerClient(csiConn(t, sock)).CreateVolume(context.Background(), &csipb.CreateVolumeRequest{
		Name: "pvc-image", VolumeCapabilities: []*csipb.VolumeCapability{mountCapability("")},
		Parameters: provisionerParameters(sc.Parameters, "pvc-image"),
	})
	require.NoError(t, err)
	fi, err := os.Stat(filepath.Join(backing, created.GetVolume().GetVolumeId()+".img"))
	require.NoError(t, err, "the controller in the image made the volume's file on the share")
	require.Equal(t, created.GetVolume().GetCapacityBytes(), fi.Size())
	p.run("stop", "--time", "30", name)
	require.Equal(t, "0", strings.TrimSpace(p.run("inspect", "--format", "{{.State.ExitCode}}", name)),
		"the controller's exit status after SIGTERM")
}
