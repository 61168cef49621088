package ibv

// pthreadMutexSize is sizeof(pthread_mutex_t) in glibc on arm64.
const pthreadMutexSize = 48
