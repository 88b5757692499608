#!/bin/bash
# Entry point of a pyzlog test-bed container: one role, one daemon in the
# foreground (docker run --init gives it a real PID 1 for signals).
#
#   zlog-node mon           needs FSID, MON_IP; /etc/ceph holds ceph.mon.keyring
#   zlog-node osd           needs OSD_ID, OSD_UUID; /etc/ceph holds ceph.osd.ID.keyring
#   zlog-node seqr          zlog-seqr on 0.0.0.0:5678 (SEQR_PORT), reached at SEQR_ADVERTISE;
#                           clients authenticate with pool zlog's secret; SEQR_ARGS adds options
#   zlog-node run CMD...    any command (the fault suite's in-container clients)
set -euo pipefail
role=${1:-}
shift || true
mkdir -p /var/run/ceph /var/log/ceph
case "$role" in
  mon)
    data=/var/lib/ceph/mon/ceph-a
    if [ ! -e "$data/done" ]; then
      monmaptool --create --fsid "$FSID" --addv a "[v2:$MON_IP:3300]" /tmp/monmap >/dev/null
      mkdir -p "$data"
      ceph-mon --mkfs -i a --monmap /tmp/monmap --keyring /etc/ceph/ceph.mon.keyring
      touch "$data/done"
    fi
    exec ceph-mon -f -i a
    ;;
  osd)
    data=/var/lib/ceph/osd/ceph-$OSD_ID
    if [ ! -e "$data/done" ]; then
      mkdir -p "$data"
      ceph-osd --mkfs -i "$OSD_ID" --osd-uuid "$OSD_UUID"
      touch "$data/done"
    fi
    exec ceph-osd -f -i "$OSD_ID"
    ;;
  seqr)
    # serves pool zlog to clients holding its secret (authentication on, as by
    # default) and stands by for it: takes over the other sequencer's logs if it dies
    # shellcheck disable=SC2086  # SEQR_ARGS is a list of options
    exec zlog-seqr --host 0.0.0.0 --port "${SEQR_PORT:-5678}" --advertise "${SEQR_ADVERTISE:?}" \
      --pool zlog --conf /etc/ceph/ceph.conf ${SEQR_ARGS:-}
    ;;
  run)
    exec "$@"
    ;;
  *)
    echo "usage: zlog-node mon|osd|seqr|run CMD..." >&2
    exit 2
    ;;
esac
