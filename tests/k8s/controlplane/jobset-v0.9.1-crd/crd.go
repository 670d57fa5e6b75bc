// Package crd only pins sigs.k8s.io/jobset v0.9.1, whose config/components build.sh copies.
package crd

import _ "sigs.k8s.io/jobset/api/jobset/v1alpha2"
