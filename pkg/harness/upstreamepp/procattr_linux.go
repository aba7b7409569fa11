package upstreamepp

import "syscall"

// sysProcAttr kills the child when this process dies, so that no EPP
// outlives the run that started it.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
