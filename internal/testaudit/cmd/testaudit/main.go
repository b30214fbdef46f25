// Command testaudit is the closing audit of a make test pass: it audits
// every namespace of databases on the two test servers (REDCELL_TEST_MYSQL_DSN_1
// and _2, set by deploy/local/testenv.sh) in both spaces, and exits 1 on any
// difference or problem. Without the servers it skips, or exits 2 in CI (CI
// set), as the tests do.
package main

import (
	"fmt"
	"os"

	"redcell/internal/testaudit"
)

func main() {
	if testaudit.TestServers() == nil {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "testaudit: CI must provide REDCELL_TEST_MYSQL_DSN_1 and _2 (run it through make test)")
			os.Exit(2)
		}
		fmt.Println("testaudit: no test servers (REDCELL_TEST_MYSQL_DSN_1/_2): closing audit skipped")
		return
	}
	name := "make test pass"
	if len(os.Args) > 1 {
		name = os.Args[1]
	}
	report, ok := testaudit.Check(name)
	fmt.Print(report)
	if !ok {
		os.Exit(1)
	}
}
