//go:build !linux

package upstreamepp

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
