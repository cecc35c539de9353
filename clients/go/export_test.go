package inboxd

import "os"

// StartTestDaemon starts inboxd on a temp data dir for the examples
// (package inboxd_test) and returns its address, its client token, and
// how to stop it and remove the directory.
func StartTestDaemon() (addr string, token []byte, stop func(), err error) {
	bin, err := findInboxd()
	if err != nil {
		return "", nil, nil, err
	}
	dir, err := os.MkdirTemp("", "inboxd-go-example-")
	if err != nil {
		return "", nil, nil, err
	}
	d, err := spawnDaemon(bin, dir+"/data", dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, nil, err
	}
	return d.addr, []byte(testToken), func() { d.stop(); os.RemoveAll(dir) }, nil
}
