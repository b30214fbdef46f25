package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"redcell/bench"
)

// workSources is what the bench reads a run's work from (bench.WorkSources)
// for the cluster of configPath: each cell's database server (SHOW GLOBAL
// STATUS: Queries and the Com_* counters; its CPU from /proc when the server
// runs on this machine), memcached (stats: commands and CPU), and the
// router's and cells' GET /metrics (their CPU, the cells' round trips).
// idle is how long the idle rate is measured before the first run. Servers
// that several cells share are read once.
func workSources(configPath string, idle time.Duration) (*bench.WorkSources, error) {
	fc, err := loadConfig(configPath)
	if err != nil {
		return nil, err
	}
	var servers []*workServer
	seen := map[string]bool{}
	for _, c := range fc.Cells {
		cfg, err := mysql.ParseDSN(c.DSN)
		if err != nil {
			return nil, fmt.Errorf("bench: cell %s: dsn: %w", c.Name, err)
		}
		if seen[cfg.Addr] {
			continue
		}
		seen[cfg.Addr] = true
		servers = append(servers, &workServer{name: c.Name, dsn: c.DSN})
	}
	w := &bench.WorkSources{IdleWindow: idle}
	for _, c := range fc.Cells {
		if c.AdminListen != "" {
			t := bench.MetricsTarget{Cell: c.Name, URL: "http://" + c.AdminListen + "/metrics"}
			w.Processes = append(w.Processes, t)
			w.Cells = append(w.Cells, t)
		}
	}
	if fc.Router.AdminListen != "" {
		w.Processes = append(w.Processes, bench.MetricsTarget{Cell: "router", URL: "http://" + fc.Router.AdminListen + "/metrics"})
	}
	mc := fc.Memcached
	w.Counters = func(ctx context.Context) (map[string]float64, []string) {
		out := map[string]float64{}
		var missing []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, s := range servers {
			wg.Go(func() {
				c, err := s.read(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					missing = append(missing, fmt.Sprintf("database of %s: %v", s.name, err))
					return
				}
				for k, v := range c {
					out[k] += v
				}
			})
		}
		for _, addr := range mc {
			wg.Go(func() {
				cmds, cpu, err := memcachedStats(ctx, addr)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					missing = append(missing, fmt.Sprintf("memcached %s: %v", addr, err))
					return
				}
				out["memcached_commands"] += cmds
				out["cpu_memcached"] += cpu
			})
		}
		wg.Wait()
		return out, missing
	}
	return w, nil
}

// workServer is one database server the bench reads counters from, over a
// connection of its own.
type workServer struct {
	name, dsn string

	once    sync.Once
	reads   atomic.Int64 // SHOW GLOBAL STATUS statements sent so far: each counts in Queries
	db      *sql.DB
	pid     int // the server's process on this machine; 0: not here (no CPU)
	openErr error
}

// open connects once and finds the server's process: its pid file, read
// here, names a mariadbd or mysqld process of this machine.
func (s *workServer) open(ctx context.Context) error {
	s.once.Do(func() {
		db, err := sql.Open("mysql", s.dsn)
		if err != nil {
			s.openErr = err
			return
		}
		db.SetMaxOpenConns(1)
		s.db = db
		var pidFile string
		if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
			return
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return
		}
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
			if c := strings.TrimSpace(string(comm)); c == "mariadbd" || c == "mysqld" {
				s.pid = pid
			}
		}
	})
	return s.openErr
}

// read is the server's statements (Queries), their kinds (Com_*), the one
// statement this read is, and its process's CPU when it runs here.
func (s *workServer) read(ctx context.Context) (map[string]float64, error) {
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, `SHOW GLOBAL STATUS WHERE Variable_name = 'Queries' OR Variable_name LIKE 'Com\_%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{"own_statements": float64(s.reads.Add(1))}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		if name == "Queries" {
			out["statements"] = v
		} else {
			out["com_"+strings.ToLower(strings.TrimPrefix(name, "Com_"))] = v
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if s.pid != 0 {
		if cpu, err := procCPUSeconds(s.pid); err == nil {
			out["cpu_mariadb"] = cpu
		}
	}
	return out, nil
}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's CPU times.
const clockTicks = 100

// procCPUSeconds is process pid's CPU time, user and system (/proc/PID/stat
// fields 14 and 15).
func procCPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:])) // from field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad CPU times", pid)
	}
	return (ut + st) / clockTicks, nil
}

// memcachedCommandStats are the stats whose sum is the commands a memcached
// served: gets (each key of a multi-get counts), sets (set, add, replace,
// cas, append, prepend), touches, flushes, increments, decrements, deletes.
var memcachedCommandStats = []string{"cmd_get", "cmd_set", "cmd_touch", "cmd_flush",
	"incr_hits", "incr_misses", "decr_hits", "decr_misses", "delete_hits", "delete_misses"}

// memcachedStats asks the memcached at addr for its stats: the commands it
// served (memcachedCommandStats) and its CPU seconds (rusage_user +
// rusage_system).
func memcachedStats(ctx context.Context, addr string) (cmds, cpu float64, err error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("stats\r\n")); err != nil {
		return 0, 0, err
	}
	stats := map[string]float64{}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := sc.Text()
		if line == "END" {
			break
		}
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "STAT" {
			if v, err := strconv.ParseFloat(f[2], 64); err == nil {
				stats[f[1]] = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if _, ok := stats["cmd_get"]; !ok {
		return 0, 0, fmt.Errorf("stats: no cmd_get")
	}
	for _, k := range memcachedCommandStats {
		cmds += stats[k]
	}
	return cmds, stats["rusage_user"] + stats["rusage_system"], nil
}
