// Command etcd is etcd v3.6 (go.etcd.io/etcd/server/v3), built from this
// wrapper module because `go install ...@version` refuses etcd's replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
