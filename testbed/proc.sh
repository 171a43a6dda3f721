# Process identity for the test bed (sourced by testbed/bed; tests source it too).
#
# A process is named by its PID *and* its start time (field 22 of /proc/PID/stat, in clock ticks
# since boot). Both are fixed from fork on: exec changes the command line but not the start time,
# so a process is recognised the instant it is spawned, before and after it execs its binary; and a
# PID reused by another process has another start time, so a stale pidfile never names it.
# Before a signal is sent, the command line must also hold a path that only this cluster uses
# (its directory), so even a matching pair can never reach another cluster's process.

# proc_start PID: the start time of PID, empty if there is no such process.
proc_start() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  # the command name (field 2) may hold spaces and parentheses: split after its last ')'
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  echo "${20}"
}

# proc_state PID: the one-letter state (R, S, Z, ...), empty if there is no such process.
proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  echo "${stat%% *}"
}

# proc_ppid PID: the parent's PID, empty if there is no such process.
proc_ppid() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  echo "$2"
}

# proc_record PID PIDFILE: writes "PID STARTTIME" for a process this shell just spawned (it is our
# child, so its PID cannot be reused before we reap it; if it already ended, the file says so).
proc_record() {
  local start
  start=$(proc_start "$1")
  echo "$1 ${start:-gone}" >"$2"
}

# proc_alive PIDFILE: the process the file names is running (not a zombie), whatever it has
# exec'd so far.
proc_alive() {
  local pid start now state
  [ -f "$1" ] || return 1
  read -r pid start <"$1" || return 1
  [ -n "$pid" ] && [ -n "$start" ] || return 1
  now=$(proc_start "$pid")
  [ -n "$now" ] && [ "$now" = "$start" ] || return 1
  state=$(proc_state "$pid")
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# proc_is PIDFILE BINARY MARK: alive, running BINARY (a full path), and its command line holds
# MARK (a path unique to one cluster). What must hold before the process is signalled.
proc_is() {
  local pidfile=$1 binary=$2 mark=$3 pid cmd
  proc_alive "$pidfile" || return 1
  read -r pid _ <"$pidfile"
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  case $cmd in "$binary "*) ;; *) return 1 ;; esac
  case $cmd in *"$mark "*) return 0 ;; *) return 1 ;; esac
}

# proc_signal PIDFILE BINARY MARK SIGNAL: signals the process only if proc_is holds, waits up to
# 10 s for it to end (then SIGKILL), and removes the pidfile.
proc_signal() {
  local pidfile=$1 binary=$2 mark=$3 sig=$4 pid
  if proc_is "$pidfile" "$binary" "$mark"; then
    read -r pid _ <"$pidfile"
    kill "-$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do proc_alive "$pidfile" || break; sleep 0.1; done
    proc_alive "$pidfile" && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}
