/* replaced by the artfsctl implementation */
int main(void) { return 1; }
