package ibv

// pthreadMutexSize is sizeof(pthread_mutex_t) in glibc on amd64.
const pthreadMutexSize = 40
