#include <cstdio>
int main() { std::puts("dsv4"); return 0; }
