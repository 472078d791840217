#include <cstdio>
int main() { std::puts("chorus"); return 0; }
