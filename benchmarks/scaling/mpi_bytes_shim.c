/* PMPI shim for benchmarks/scaling/multinode_bytes.sh: counts, per rank, the calls
 * and the bytes each MPI collective that ditrl uses moves to or from other
 * ranks (the "logical" volume a cost model predicts, whatever algorithm or
 * transport MPI then picks), split at 64 KiB into the bulk (parameter gathers,
 * gradient reduce-scatters) and the small control traffic (norms, metrics,
 * stop flags, manifests). Loaded with LD_PRELOAD; writes
 * $DITRL_MPI_BYTES_DIR/rank-<world rank>.txt at MPI_Finalize, one line per
 * op and size class: "<op> <bulk|small> <calls> <bytes>", then one line per
 * distinct (op, bytes per call) of the bulk: "size <op> <bytes> <calls>",
 * which names the units behind the totals. A program that wants only part
 * of its run counted calls mpi_bytes_shim_reset() (looked up with dlsym, so
 * that it runs without the shim) at the start of that part, on every rank.
 *
 * Bytes per call, this rank's share:
 *   MPI_Allgather / MPI_Allgatherv  received from the others: sum of their counts
 *   MPI_Alltoall                    sent to the others: (n - 1) * count
 *   MPI_Bcast                       the buffer (root: what it sends to one peer)
 *   MPI_Gather                      sent to the root (root: received)
 *
 *   mpicc -shared -fPIC -O2 -o mpi_bytes_shim.so benchmarks/scaling/mpi_bytes_shim.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { OP_ALLGATHER, OP_ALLGATHERV, OP_ALLTOALL, OP_BCAST, OP_GATHER, OP_COUNT };
static const char* const kNames[OP_COUNT] = {"allgather", "allgatherv", "alltoall", "bcast", "gather"};
static const long long kBulk = 64 * 1024;

/* [op][0 small, 1 bulk] — prefetch gathers run on a second thread: atomics. */
static long long calls[OP_COUNT][2], bytes[OP_COUNT][2];

/* Distinct bulk call sizes (a model has a handful of unit sizes). */
enum { kSizes = 256 };
static struct { int op; long long bytes, calls; } sizes[kSizes];
static int size_count;
static int size_lock;

static void add_size(int op, long long n) {
  while (__atomic_exchange_n(&size_lock, 1, __ATOMIC_ACQUIRE)) {
  }
  int i = 0;
  while (i < size_count && !(sizes[i].op == op && sizes[i].bytes == n)) ++i;
  if (i == size_count && size_count < kSizes) sizes[size_count++] = (typeof(sizes[0])){op, n, 0};
  if (i < size_count) ++sizes[i].calls;
  __atomic_store_n(&size_lock, 0, __ATOMIC_RELEASE);
}

static void add(int op, long long n) {
  const int bulk = n >= kBulk;
  __atomic_fetch_add(&calls[op][bulk], 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&bytes[op][bulk], n, __ATOMIC_RELAXED);
  if (bulk) add_size(op, n);
}

/* Forgets everything counted so far (no collective may be in flight). */
void mpi_bytes_shim_reset(void) {
  for (int op = 0; op < OP_COUNT; ++op)
    for (int bulk = 0; bulk < 2; ++bulk) {
      __atomic_store_n(&calls[op][bulk], 0, __ATOMIC_RELAXED);
      __atomic_store_n(&bytes[op][bulk], 0, __ATOMIC_RELAXED);
    }
  while (__atomic_exchange_n(&size_lock, 1, __ATOMIC_ACQUIRE)) {
  }
  size_count = 0;
  __atomic_store_n(&size_lock, 0, __ATOMIC_RELEASE);
}

static long long type_bytes(MPI_Datatype type, long long count) {
  int size = 0;
  PMPI_Type_size(type, &size);
  return count * size;
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  add(OP_ALLGATHER, type_bytes(recvtype, (long long)(n - 1) * recvcount));
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                   const int displs[], MPI_Datatype recvtype, MPI_Comm comm) {
  int n = 1, me = 0;
  PMPI_Comm_size(comm, &n);
  PMPI_Comm_rank(comm, &me);
  long long total = 0;
  for (int r = 0; r < n; ++r)
    if (r != me) total += recvcounts[r];
  add(OP_ALLGATHERV, type_bytes(recvtype, total));
  return PMPI_Allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm);
}

int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                 MPI_Datatype recvtype, MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  add(OP_ALLTOALL, type_bytes(sendtype, (long long)(n - 1) * sendcount));
  return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  add(OP_BCAST, type_bytes(datatype, count));
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}

int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
               MPI_Datatype recvtype, int root, MPI_Comm comm) {
  int n = 1, me = 0;
  PMPI_Comm_size(comm, &n);
  PMPI_Comm_rank(comm, &me);
  add(OP_GATHER, me == root ? type_bytes(recvtype, (long long)(n - 1) * recvcount) : type_bytes(sendtype, sendcount));
  return PMPI_Gather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root, comm);
}

int MPI_Finalize(void) {
  const char* dir = getenv("DITRL_MPI_BYTES_DIR");
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (dir && *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.txt", dir, rank);
    FILE* out = fopen(path, "w");
    if (out) {
      for (int op = 0; op < OP_COUNT; ++op)
        for (int bulk = 0; bulk < 2; ++bulk)
          fprintf(out, "%s %s %lld %lld\n", kNames[op], bulk ? "bulk" : "small", calls[op][bulk], bytes[op][bulk]);
      for (int i = 0; i < size_count; ++i)
        fprintf(out, "size %s %lld %lld\n", kNames[sizes[i].op], sizes[i].bytes, sizes[i].calls);
      fclose(out);
    }
  }
  return PMPI_Finalize();
}
