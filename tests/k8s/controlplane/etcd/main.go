// The etcd server, built from go.etcd.io/etcd/server/v3 at the version go.mod pins.
//
// etcd's own main package lives in the root module go.etcd.io/etcd/v3, whose go.mod replaces
// its sibling modules with folders of its repository, so it cannot be built as a dependency;
// this is the same two lines as its main.go, against the published server module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
